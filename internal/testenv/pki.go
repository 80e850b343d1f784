package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a throwaway certificate authority with one server and one client
// certificate, for tests of TLS and mutual TLS on loopback. The PEM files
// are in a t.TempDir(); the keys are P-256 and valid from an hour ago to
// an hour from now.
type PKI struct {
	// CA signed both certificates; Pool holds it alone.
	CA   *x509.Certificate
	Pool *x509.CertPool
	// Server is valid for 127.0.0.1, ::1 and localhost; Client is a
	// client-auth certificate.
	Server, Client tls.Certificate

	// PEM files: the CA certificate, and each certificate with its key.
	CAFile                        string
	ServerCertFile, ServerKeyFile string
	ClientCertFile, ClientKeyFile string
}

// NewPKI makes a fresh PKI; any error fails the test.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pulse test CA"},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, name string) (tls.Certificate, string, string) {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: notBefore, NotAfter: notAfter,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k},
			write(name+".pem", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", keyDER)
	}
	p := &PKI{CA: ca, Pool: x509.NewCertPool(), CAFile: write("ca.pem", "CERTIFICATE", caDER)}
	p.Pool.AddCert(ca)
	p.Server, p.ServerCertFile, p.ServerKeyFile = issue(2, "pulse test server", x509.ExtKeyUsageServerAuth, "server")
	p.Client, p.ClientCertFile, p.ClientKeyFile = issue(3, "pulse test client", x509.ExtKeyUsageClientAuth, "client")
	return p
}

// ServerConfig serves the server certificate and requires a client
// certificate signed by the CA.
func (p *PKI) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.Server},
		ClientCAs: p.Pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

// ClientConfig trusts the CA and presents the client certificate.
func (p *PKI) ClientConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.Pool, Certificates: []tls.Certificate{p.Client}}
}
