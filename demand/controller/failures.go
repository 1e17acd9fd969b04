package controller

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
)

// Demand sharing's failures, told loudly: a report this replica cannot write, and
// a report the leader cannot read. Each has a cause from a short fixed
// list (a metric label each), a WARN when the cause starts or changes, and
// a line on the admin pages while it lasts. A failure that repeats with
// the same cause does not log again: a key held by another session would
// otherwise log every interval.

// Why a report could not be written.
const (
	writeHeld        = "held"         // another session holds the key
	writeSessionGone = "session_gone" // this replica's session no longer exists
	writeDenied      = "denied"       // 403: the token may not write under --demand-prefix
	writeUnreachable = "unreachable"  // Consul did not answer
	writeOther       = "other"
)

var writeCauses = []string{writeHeld, writeSessionGone, writeDenied, writeUnreachable, writeOther}

// Why the leader could not use a report.
const (
	readUndecodable = "undecodable" // not a report: garbage, truncated, a bad checksum
	readVersion     = "version"     // a report of another format version
	readOversized   = "oversized"   // larger than any report can be
	readWrongNode   = "wrong_node"  // a report naming another node than its key's
)

var readCauses = []string{readUndecodable, readVersion, readOversized, readWrongNode}

// writeCause classifies a failed write.
func writeCause(err error) string {
	var se api.StatusError
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.Is(err, consulkv.ErrSessionGone):
		return writeSessionGone
	case errors.Is(err, consulkv.ErrRefused):
		return writeHeld
	case errors.As(err, &se) && se.Code == 403:
		return writeDenied
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne), errors.As(err, &ue):
		return writeUnreachable
	case strings.Contains(err.Error(), "Permission denied"), strings.Contains(err.Error(), "ACL not found"):
		return writeDenied
	}
	return writeOther
}

// readCause classifies a report the leader could not decode.
func readCause(err error) string {
	if strings.Contains(err.Error(), "version") {
		return readVersion
	}
	return readUndecodable
}

// minRewarn is how long a cause that cleared and came back stays quiet: a
// report that is garbage every other division logs once a minute, not
// twice a second.
const minRewarn = time.Minute

// causeLog decides when a failure is worth a log line. The zero value is
// ready; not safe for concurrent use.
type causeLog struct {
	last map[string]causeState // by what failed: "" for this replica's writes, a node for the reports read
}

type causeState struct {
	cause    string
	active   bool      // failing now
	loud     bool      // this failure was logged, so its end is too
	warnedAt time.Time // the last WARN
}

// fail records that key fails with cause at now, and reports whether to
// WARN: when it starts failing (unless with the cause it last warned of,
// within minRewarn) or its cause changes.
func (c *causeLog) fail(key, cause string, now time.Time) bool {
	if c.last == nil {
		c.last = map[string]causeState{}
	}
	st := c.last[key]
	warn := st.cause != cause || (!st.active && now.Sub(st.warnedAt) >= minRewarn)
	if warn {
		st.warnedAt = now
	}
	st.loud = warn || (st.active && st.loud)
	st.cause, st.active = cause, true
	c.last[key] = st
	return warn
}

// ok records that key works again; it returns the cause that ended when
// its failure was logged, "" otherwise.
func (c *causeLog) ok(key string) string {
	st, found := c.last[key]
	if !found || !st.active {
		return ""
	}
	st.active = false
	c.last[key] = st
	if st.loud {
		return st.cause
	}
	return ""
}

// forget drops keys that no longer fail and warned long enough ago: the
// nodes of the reports read come and go.
func (c *causeLog) forget(now time.Time) {
	for k, st := range c.last {
		if !st.active && now.Sub(st.warnedAt) >= minRewarn {
			delete(c.last, k)
		}
	}
}

// badReport is a report the leader could not use in its last division.
type badReport struct {
	node, cause, err string
}

// readReport decodes one report of a snapshot for the leader: the report,
// or why it cannot be used.
func readReport(kv consulkv.KVReport) (demand.Report, *badReport) {
	if kv.Oversized {
		return demand.Report{}, &badReport{kv.Node, readOversized, "larger than a report can be"}
	}
	r, err := demand.DecodeReport(kv.Value)
	if err != nil {
		return r, &badReport{kv.Node, readCause(err), err.Error()}
	}
	if r.Node != kv.Node {
		return r, &badReport{kv.Node, readWrongNode, "the report names node " + r.Node}
	}
	return r, nil
}

// noteBad records the reports the last division could not use: counted
// by cause, logged when a node's cause starts or changes, kept for the
// admin pages.
func (c *Controller) noteBad(bad []badReport, now time.Time) {
	type line struct {
		warn        bool
		node, cause string
		err         string
	}
	var lines []line
	c.mu.Lock()
	failing := map[string]bool{}
	for _, b := range bad {
		failing[b.node] = true
		c.badReps[b.cause]++
		if c.readLog.fail(b.node, b.cause, now) {
			lines = append(lines, line{true, b.node, b.cause, b.err})
		}
	}
	for node := range c.readLog.last {
		if !failing[node] {
			if cause := c.readLog.ok(node); cause != "" {
				lines = append(lines, line{false, node, cause, ""})
			}
		}
	}
	c.readLog.forget(now)
	c.bad = bad
	c.mu.Unlock()
	for _, l := range lines {
		if l.warn {
			c.log.Warn("demand report unusable; its replica is not counted, and takes at most its equal share",
				"service", c.set.Service, "node", l.node, "cause", l.cause, "err", l.err)
		} else {
			c.log.Info("demand report usable again", "service", c.set.Service, "node", l.node, "after", l.cause)
		}
	}
}
