package human

import (
	"strconv"
	"strings"
)

// namesShown is how many names Names spells out.
const namesShown = 3

// Names is a list of names as a log line or a notice shows it: the first
// three joined with commas, the rest counted ("A, B, C and 2 more"). It is
// how every message says what put the daemon in upstream's mode
// (config.Config.UpstreamBy), so the list reads the same wherever it does.
func Names(names []string) string {
	if len(names) <= namesShown {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:namesShown], ", ") + " and " + strconv.Itoa(len(names)-namesShown) + " more"
}
