package config

import (
	"errors"
	"fmt"
	"strings"
)

// ParseKeyValues reads upstream's key-value lists, as
// CONFIG_GRPC_XDS_NODE_METADATA and CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS
// hold them: comma-separated entries, each a key and a value split at the
// first ':' or '=' ("k1:v1,k2=v2"; "url=http://x" keeps its colon). Spaces
// around keys and values are trimmed, and empty entries skipped. An entry
// without a separator, an empty key, and a key given twice are errors,
// reported together; they name the entry by its position and never repeat a
// value, which may be a secret (a header carrying a token). It returns a
// non-nil map, empty for "", when there is no error.
func ParseKeyValues(s string) (map[string]string, error) {
	out := map[string]string{}
	var errs []error
	for i, entry := range strings.Split(s, ",") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		at := strings.IndexAny(entry, ":=")
		if at < 0 {
			errs = append(errs, fmt.Errorf("entry %d has no ':' or '=' between key and value", i+1))
			continue
		}
		k, v := strings.TrimSpace(entry[:at]), strings.TrimSpace(entry[at+1:])
		if k == "" {
			errs = append(errs, fmt.Errorf("entry %d has an empty key", i+1))
			continue
		}
		if _, dup := out[k]; dup {
			errs = append(errs, fmt.Errorf("key %q is given twice", k))
			continue
		}
		out[k] = v
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// validHostname reports whether s can be a DNS name: letters, digits, '-' and
// '.', as a host name in upstream's HOST variables.
func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}
