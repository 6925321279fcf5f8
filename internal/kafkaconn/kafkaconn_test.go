package kafkaconn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/tlsfiles"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// secure is the configuration of a client of the SASL_SSL listener.
func secure(t *testing.T, k *testenv.SecureKafka, mechanism string) kafkaconn.Config {
	return kafkaconn.Config{TLSFiles: caFile(k.CAFile), SASLMechanism: mechanism, SASLUsername: k.Username,
		SASLPassword: k.Password(t)}
}

// caFile are TLS files with the CA bundle ca alone.
func caFile(ca string) tlsfiles.Files {
	return tlsfiles.Files{CA: ca, CAVar: "COORDINATOR_KAFKA_TLS_CA_FILE", CertVar: "COORDINATOR_KAFKA_TLS_CERT_FILE",
		KeyVar: "COORDINATOR_KAFKA_TLS_KEY_FILE"}
}

// client builds a franz-go client on brokers the way every coordinator
// client does.
func client(t *testing.T, brokers []string, cfg kafkaconn.Config, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts, err := kafkaconn.Options(cfg, nil)
	require.NoError(t, err)
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...), extra...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func TestEveryMechanismOnTheSecureListener(t *testing.T) {
	t.Parallel()
	k := testenv.KafkaSecure(t)
	plain := testenv.Kafka(t)
	for _, mech := range []string{kafkaconn.SASLPlain, kafkaconn.SASLScramSHA256, kafkaconn.SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			cfg := secure(t, k, mech)
			require.Equal(t, "sasl_ssl/"+mech+" user="+k.Username, kafkaconn.Describe(cfg))
			cl := client(t, k.Brokers, cfg, kgo.ProducerLinger(0))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, kafkaconn.Check(ctx, cl))

			// Admin, produce: over SASL_SSL. Read back over the PLAINTEXT
			// listener of the same broker.
			topic := plain.Topic("secure." + strings.ToLower(mech))
			adm := kadm.NewClient(cl)
			_, err := adm.CreateTopic(ctx, 1, -1, nil, topic)
			require.NoError(t, err)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = adm.DeleteTopics(ctx, topic)
			})
			require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(mech)}).FirstErr())
			recs := testenv.ReadRecords(t, plain.Brokers, topic, 1)
			require.Equal(t, mech, string(recs[0].Value))
		})
	}
}

// checkFails runs Check with cfg on brokers and returns its error, which must be a
// failure retrying cannot mend, found within the bound that "fails fast"
// means here (the broker answers in milliseconds; 10s survives a busy box).
func checkFails(t *testing.T, brokers []string, cfg kafkaconn.Config, kind error) error {
	t.Helper()
	cl := client(t, brokers, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := kafkaconn.Check(ctx, cl)
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "Check must fail at once, not retry until the deadline")
	require.True(t, kafkaconn.Fatal(err), "%v", err)
	require.ErrorIs(t, err, kind)
	return err
}

func TestWrongPasswordFailsFastWithoutThePassword(t *testing.T) {
	t.Parallel()
	k := testenv.KafkaSecure(t)
	for _, mech := range []string{kafkaconn.SASLPlain, kafkaconn.SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			cfg := secure(t, k, mech)
			cfg.SASLPassword = "wrong-Hunter2-password"
			err := checkFails(t, k.Brokers, cfg, kafkaconn.ErrAuthentication)
			require.NotContains(t, err.Error(), "Hunter2")
			require.NotContains(t, err.Error(), k.Password(t))
			require.Contains(t, err.Error(), "COORDINATOR_KAFKA_SASL_PASSWORD")
		})
	}
}

func TestCertificateProblemsAreFatal(t *testing.T) {
	t.Parallel()
	k := testenv.KafkaSecure(t)
	foreignCA, foreignCert, foreignKey := testenv.ForeignTLS(t)
	t.Run("system roots do not know the test CA", func(t *testing.T) {
		t.Parallel()
		cfg := secure(t, k, kafkaconn.SASLScramSHA512)
		cfg.TLSFiles.CA, cfg.TLS = "", true
		_ = checkFails(t, k.Brokers, cfg, kafkaconn.ErrCertificate)
	})
	t.Run("another CA", func(t *testing.T) {
		t.Parallel()
		cfg := secure(t, k, kafkaconn.SASLScramSHA512)
		cfg.TLSFiles.CA = foreignCA
		_ = checkFails(t, k.Brokers, cfg, kafkaconn.ErrCertificate)
	})
	t.Run("client certificate", func(t *testing.T) {
		t.Parallel()
		// The mTLS listener requires a certificate of the test CA: without
		// one, or with another CA's, the handshake fails; with the test
		// client's it passes, which proves the client sends what it is given.
		cfg := kafkaconn.Config{TLSFiles: caFile(k.CAFile)}
		_ = checkFails(t, k.MTLSBrokers, cfg, kafkaconn.ErrCertificate)
		cfg.TLSFiles.Cert, cfg.TLSFiles.Key = foreignCert, foreignKey
		_ = checkFails(t, k.MTLSBrokers, cfg, kafkaconn.ErrCertificate)

		cfg.TLSFiles.Cert, cfg.TLSFiles.Key = k.ClientCertFile, k.ClientKeyFile
		cl := client(t, k.MTLSBrokers, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, kafkaconn.Check(ctx, cl))
	})
	t.Run("plaintext client on the TLS listener", func(t *testing.T) {
		t.Parallel()
		_ = checkFails(t, k.Brokers, kafkaconn.Config{}, kafkaconn.ErrHandshake)
	})
}

func TestUnreachableIsNotFatal(t *testing.T) {
	t.Parallel()
	cl := client(t, []string{"127.0.0.1:1"}, kafkaconn.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := kafkaconn.Check(ctx, cl)
	require.Error(t, err)
	require.False(t, kafkaconn.Fatal(err), "a broker that is down may come back: %v", err)
	var ke *kafkaconn.Error
	require.False(t, errors.As(err, &ke))
}

func TestPlaintextHasNoOptions(t *testing.T) {
	t.Parallel()
	var cfg kafkaconn.Config
	opts, err := kafkaconn.Options(cfg, nil)
	require.NoError(t, err)
	require.Empty(t, opts)
	require.Equal(t, "plaintext", kafkaconn.Describe(cfg))
}
