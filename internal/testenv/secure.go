package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The secure listeners of scripts/services (`scripts/services env` exports
// them once `up` has generated their certificates).
const (
	EnvKafkaSecureBrokers    = "COORDINATOR_TEST_KAFKA_SECURE_BROKERS"
	EnvKafkaTLSCAFile        = "COORDINATOR_TEST_KAFKA_TLS_CA_FILE"
	EnvKafkaSASLUsername     = "COORDINATOR_TEST_KAFKA_SASL_USERNAME"
	EnvKafkaSASLPasswordFile = "COORDINATOR_TEST_KAFKA_SASL_PASSWORD_FILE"
	EnvKafkaMTLSBrokers      = "COORDINATOR_TEST_KAFKA_MTLS_BROKERS"
	EnvRedisTLSURL           = "COORDINATOR_TEST_REDIS_TLS_URL"
	EnvRedisTLSCAFile        = "COORDINATOR_TEST_REDIS_TLS_CA_FILE"
	EnvPGTLSCAFile           = "COORDINATOR_TEST_PG_TLS_CA_FILE"
	EnvTLSClientCertFile     = "COORDINATOR_TEST_TLS_CLIENT_CERT_FILE"
	EnvTLSClientKeyFile      = "COORDINATOR_TEST_TLS_CLIENT_KEY_FILE"
)

// requireSecure returns the variables' values, or skips the test naming the
// first one that is missing: the secure listeners come only from
// scripts/services (no container fallback).
func requireSecure(t testing.TB, names ...string) []string {
	t.Helper()
	vals := make([]string, len(names))
	for i, n := range names {
		if vals[i] = os.Getenv(n); vals[i] == "" {
			t.Skipf("testenv: %s is not set: this test needs the TLS listeners of scripts/services "+
				"(`scripts/services up` with this version of the script, then `eval \"$(scripts/services env)\"`)", n)
		}
	}
	return vals
}

// SecureKafka is the SASL_SSL listener of the test broker: the same broker
// as Kafka(t)'s PLAINTEXT listener, so a test can check over plaintext what
// the code under test wrote over SASL_SSL.
type SecureKafka struct {
	Brokers      []string
	CAFile       string
	Username     string
	PasswordFile string
	// MTLSBrokers is the broker's SSL listener that requires a client
	// certificate (and no SASL).
	MTLSBrokers []string
	// ClientCertFile and ClientKeyFile are a client certificate the broker
	// accepts (signed by CAFile's CA).
	ClientCertFile, ClientKeyFile string
}

// Password reads PasswordFile.
func (k *SecureKafka) Password(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(k.PasswordFile)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvKafkaSASLPasswordFile, err)
	}
	return strings.TrimSpace(string(b))
}

// KafkaSecure returns the SASL_SSL listener, or skips the test when
// scripts/services did not export it.
func KafkaSecure(t testing.TB) *SecureKafka {
	t.Helper()
	v := requireSecure(t, EnvKafkaSecureBrokers, EnvKafkaTLSCAFile, EnvKafkaSASLUsername, EnvKafkaSASLPasswordFile,
		EnvKafkaMTLSBrokers, EnvTLSClientCertFile, EnvTLSClientKeyFile)
	return &SecureKafka{Brokers: strings.Split(v[0], ","), CAFile: v[1], Username: v[2], PasswordFile: v[3],
		MTLSBrokers: strings.Split(v[4], ","), ClientCertFile: v[5], ClientKeyFile: v[6]}
}

// SecureRedis is the TLS port of the test Redis (the same server as
// Redis(t)'s).
type SecureRedis struct {
	URL    string // rediss://127.0.0.1:PORT/0
	CAFile string
	// ClientCertFile and ClientKeyFile are a client certificate the server
	// accepts (it verifies a presented certificate against CAFile's CA).
	ClientCertFile, ClientKeyFile string
}

// RedisTLS returns the TLS port of the test Redis, or skips the test when
// scripts/services did not export it.
func RedisTLS(t testing.TB) *SecureRedis {
	t.Helper()
	v := requireSecure(t, EnvRedisTLSURL, EnvRedisTLSCAFile, EnvTLSClientCertFile, EnvTLSClientKeyFile)
	return &SecureRedis{URL: v[0], CAFile: v[1], ClientCertFile: v[2], ClientKeyFile: v[3]}
}

// PGTLSCAFile returns the CA file that verifies the test PostgreSQL's
// certificate (for 127.0.0.1 and localhost), or skips the test.
func PGTLSCAFile(t testing.TB) string {
	t.Helper()
	return requireSecure(t, EnvPGTLSCAFile)[0]
}

// ForeignTLS writes a throwaway CA and a client certificate signed by it
// into the test's temporary directory: a CA that verifies none of the test
// servers, and a client certificate none of them trusts.
func ForeignTLS(t testing.TB) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "foreign test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "foreign client"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.crt", "CERTIFICATE", caDER), write("client.crt", "CERTIFICATE", der), write("client.key", "PRIVATE KEY", keyDER)
}

// AdminToken returns a random admin token long enough for
// COORDINATOR_ADMIN_TOKEN (64 hex characters).
func AdminToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
