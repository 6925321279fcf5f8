// Package tlsfiles turns the PEM files of the *_TLS_CA_FILE, *_TLS_CERT_FILE
// and *_TLS_KEY_FILE settings into a crypto/tls client configuration, with
// errors that name the setting (never the file's content).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Files are the PEM files of one client and the names of the settings that
// set them (for error messages).
type Files struct {
	// CA is a bundle of PEM certificates that replaces the system roots for
	// verifying the server. Empty: the system roots.
	CA string
	// Cert and Key are the client's certificate (chain) and private key,
	// for servers that authenticate clients by certificate. Both or neither.
	Cert, Key string

	// CAVar, CertVar and KeyVar name the settings in errors.
	CAVar, CertVar, KeyVar string
}

// Error names the setting whose file is wrong.
type Error struct {
	Variable string // e.g. COORDINATOR_KAFKA_TLS_CA_FILE
	Path     string
	Err      error
}

func (e *Error) Error() string { return e.Variable + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Any reports whether any file is set.
func (f Files) Any() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Apply loads the files into c: RootCAs from CA, Certificates from Cert and
// Key. It does not touch the other fields (ServerName, MinVersion).
func (f Files) Apply(c *tls.Config) error {
	switch {
	case f.Cert != "" && f.Key == "":
		return &Error{Variable: f.KeyVar, Err: fmt.Errorf("required with %s", f.CertVar)}
	case f.Key != "" && f.Cert == "":
		return &Error{Variable: f.CertVar, Err: fmt.Errorf("required with %s", f.KeyVar)}
	}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return &Error{Variable: f.CAVar, Path: f.CA, Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return &Error{Variable: f.CAVar, Path: f.CA, Err: fmt.Errorf("%s holds no PEM certificate", f.CA)}
		}
		c.RootCAs = pool
	}
	if f.Cert != "" {
		for _, file := range []struct{ variable, path string }{{f.CertVar, f.Cert}, {f.KeyVar, f.Key}} {
			if _, err := os.Stat(file.path); err != nil {
				return &Error{Variable: file.variable, Path: file.path, Err: err}
			}
		}
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			// crypto/tls's messages name the problem (no PEM block, key
			// does not match), never the key material.
			return &Error{Variable: f.CertVar, Path: f.Cert, Err: fmt.Errorf("%s with %s: %w", f.Cert, f.KeyVar, err)}
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// Config returns a client configuration (TLS 1.2 or newer) with the files
// loaded.
func (f Files) Config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if err := f.Apply(c); err != nil {
		return nil, err
	}
	return c, nil
}
