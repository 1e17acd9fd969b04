package config

import (
	"regexp"
	"strings"
)

// Kubernetes' service links. With enableServiceLinks on (the default), the
// kubelet gives every container variables for every Service of its
// namespace: for a Service named grpc, GRPC_SERVICE_HOST=10.96.0.5,
// GRPC_SERVICE_PORT=8081, GRPC_PORT=tcp://10.96.0.5:8081,
// GRPC_PORT_8081_TCP=tcp://..., and _PROTO, _PORT and _ADDR after that. Some
// of those names are upstream's (GRPC_PORT, DEBUG_PORT, STATSD_PORT), or in
// its families (REDIS_*). Nobody set them, and upstream itself could not
// parse GRPC_PORT=tcp://..., so they are read as unset: they neither put the
// daemon in upstream's mode nor set, refuse or warn about anything. Docker's
// legacy --link sets the same port forms (STATSD_PORT=tcp://172.17.0.2:8125)
// without a _SERVICE_HOST; a _PORT variable holding proto://ip:port is read
// as unset too.

// linkPort is the tail of a port variable after its service prefix.
var linkPort = regexp.MustCompile(`^_PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?$`)

// serviceLink reports whether name, set to value, is a Kubernetes service
// link (a variable of the Service whose <PREFIX>_SERVICE_HOST is set too), or
// a port link of Docker's legacy --link, which sets <ALIAS>_PORT and
// <ALIAS>_PORT_<n>_<PROTO>... to proto://ip:port with no _SERVICE_HOST.
func serviceLink(name, value string, getenv func(string) string) bool {
	if p, ok := strings.CutSuffix(name, "_SERVICE_HOST"); ok && p != "" {
		return true
	}
	if strings.Contains(name, "_PORT") && linkURL(value) {
		return true // no port or host variable of upstream's takes a URL
	}
	for i := strings.Index(name, "_"); i > 0; i = nextUnderscore(name, i) {
		prefix, tail := name[:i], name[i:]
		if getenv(prefix+"_SERVICE_HOST") == "" {
			continue
		}
		if tail == "_SERVICE_PORT" || strings.HasPrefix(tail, "_SERVICE_PORT_") {
			return true
		}
		if linkPort.MatchString(tail) && (tail != "_PORT" || linkURL(value)) {
			return true
		}
	}
	return false
}

// nextUnderscore is the index of the next "_" in name after i, or -1.
func nextUnderscore(name string, i int) int {
	j := strings.Index(name[i+1:], "_")
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// linkURL reports whether v is a service link's address, proto://ip:port.
func linkURL(v string) bool {
	for _, p := range []string{"tcp://", "udp://", "sctp://"} {
		if strings.HasPrefix(v, p) {
			return true
		}
	}
	return false
}

// withoutServiceLinks reads the environment through getenv, with every
// service link read as unset.
func withoutServiceLinks(getenv func(string) string) func(string) string {
	return func(name string) string {
		v := getenv(name)
		if v != "" && serviceLink(name, v, getenv) {
			return ""
		}
		return v
	}
}
