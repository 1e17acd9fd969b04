package loadgen

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// procCPU returns the user plus system CPU time that process pid and all its
// threads have used so far, from /proc/PID/stat. The kernel counts it in clock
// ticks (10 ms on usual kernels), so a measured window needs to be long enough for
// that resolution not to matter: a second or more.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read cpu time of pid %d: %w", pid, err)
	}
	d, err := parseStatCPU(b, clockTick())
	if err != nil {
		return 0, fmt.Errorf("read cpu time of pid %d: %w", pid, err)
	}
	return d, nil
}

var errStatFormat = errors.New("unexpected /proc stat format")

// parseStatCPU extracts utime+stime (fields 14 and 15) from a /proc/PID/stat line.
// The command name in field 2 is in parentheses and may itself hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStatCPU(b []byte, tick time.Duration) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errStatFormat
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, errStatFormat
	}
	utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errStatFormat
	}
	return time.Duration(utime+stime) * tick, nil
}

// clockTick is the unit of /proc CPU times. The kernel hands it to every process in
// the auxiliary vector as AT_CLKTCK; without cgo there is no sysconf, so read it from
// there and fall back to the near-universal 100 Hz. A run reads it twice per
// server, so it is not worth caching in a package variable.
func clockTick() time.Duration {
	const atClkTck = 17
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		if hz := auxvValue(b, atClkTck); hz > 0 && hz <= 1e9 {
			return time.Second / time.Duration(hz)
		}
	}
	return 10 * time.Millisecond
}

// auxvValue finds the value for key in a native-endian auxiliary vector of
// word-sized pairs.
func auxvValue(b []byte, key uint64) uint64 {
	const word = strconv.IntSize / 8
	for len(b) >= 2*word {
		var k, v uint64
		if word == 8 {
			k, v = binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:])
		} else {
			k, v = uint64(binary.NativeEndian.Uint32(b)), uint64(binary.NativeEndian.Uint32(b[4:]))
		}
		if k == key {
			return v
		}
		if k == 0 { // AT_NULL ends the vector
			return 0
		}
		b = b[2*word:]
	}
	return 0
}

// selfCPU returns the CPU time this process has used, user plus system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
