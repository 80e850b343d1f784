// Package cabundle names where a Linux system keeps its CA bundle: the
// backend package reads the system's roots from there, and the namespace
// backend's sandbox init binds the egress proxy's bundle over them. A leaf
// of its own so that the init, which links as little as it can, need not
// link package backend for one list.
package cabundle

// System are the usual paths of a Linux system's CA bundle, the first
// found being the system's trust store.
var System = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}
