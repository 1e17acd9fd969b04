package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sharelimit/sharelimit/internal/envoymodel"
)

// errStat is returned for a /proc/PID/stat line that does not parse.
var errStat = errors.New("unexpected /proc stat format")

// parseStat returns utime+stime (fields 14 and 15 of /proc/PID/stat) as a
// duration, tick being the length of the clock tick they are counted in.
// Field 2, the command name, is in parentheses and may hold spaces and
// parentheses itself, so fields are counted from the last ')'.
func parseStat(b []byte, tick time.Duration) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errStat
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, errStat
	}
	utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errStat
	}
	return time.Duration(utime+stime) * tick, nil
}

// processCPU is the CPU time process pid has used so far, user and system.
func processCPU(pid int, tick time.Duration) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	d, err := parseStat(b, tick)
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	return d, nil
}

// clockTick is the unit of /proc's CPU times: the kernel gives it to every
// process as AT_CLKTCK (17) in its auxiliary vector. Without it, 10 ms,
// which is USER_HZ on Linux's usual builds.
func clockTick() time.Duration {
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		if hz := auxValue(b, 17); hz > 0 && hz <= uint64(time.Second) {
			return time.Second / time.Duration(hz)
		}
	}
	return 10 * time.Millisecond
}

// auxValue finds key in an auxiliary vector of native-endian 64-bit pairs,
// ended by a zero key; 0 when it is not there.
func auxValue(b []byte, key uint64) uint64 {
	for ; len(b) >= 16; b = b[16:] {
		k := binary.NativeEndian.Uint64(b)
		if k == 0 {
			break
		}
		if k == key {
			return binary.NativeEndian.Uint64(b[8:])
		}
	}
	return 0
}

// sample is one measured window of one daemon: its CPU time over the
// window, the window's length, and the requests offered and admitted in it.
type sample struct {
	cpu, elapsed      time.Duration
	offered, admitted uint64
}

// perSecond is n over the window, per second; 0 for an empty window.
func (s sample) perSecond(n float64) float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return n / s.elapsed.Seconds()
}

// cpuPerSecond is the daemon's CPU-seconds per second of the window.
func (s sample) cpuPerSecond() float64 { return s.perSecond(s.cpu.Seconds()) }

// nsPerAdmitted is the daemon's CPU-nanoseconds per admitted request; NaN
// when nothing was admitted.
func (s sample) nsPerAdmitted() float64 {
	if s.admitted == 0 {
		return math.NaN()
	}
	return float64(s.cpu.Nanoseconds()) / float64(s.admitted)
}

// median of v; NaN for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// accuracy is how closely one run held a limit L, from its admissions in
// slots: the busiest one-second window (ten slots) and the mean admitted a
// second.
type accuracy struct {
	busiest uint64
	at      time.Duration // from the start of the counted slots
	mean    float64
	limit   float64
}

func (a accuracy) busiestPct() float64 { return 100 * float64(a.busiest) / a.limit }
func (a accuracy) meanPct() float64    { return 100 * a.mean / a.limit }

// accuracyOf counts the slots [from, to) of s against limit.
func accuracyOf(s envoymodel.Slots, from, to int64, limit float64) accuracy {
	w := s.Window(from, to)
	most, at := w.MaxWindow(int(time.Second / envoymodel.SlotWidth))
	return accuracy{busiest: most, at: time.Duration(at-from) * envoymodel.SlotWidth, mean: w.Mean(), limit: limit}
}

// slotOf is the slot of a clock reading, as the model Envoys number theirs.
func slotOf(ns int64) int64 { return ns / int64(envoymodel.SlotWidth) }

// slots counts admissions by slot, for the RLS client, as the model Envoys
// count theirs. Safe for concurrent use; the zero value is empty.
type slots struct {
	mu     sync.Mutex
	first  int64
	counts []uint64
}

// add counts one admission at clock reading now. A reading before the first
// counts in the first slot.
func (c *slots) add(now int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	slot := slotOf(now)
	if len(c.counts) == 0 {
		c.first = slot
	}
	i := int(max(slot-c.first, 0))
	for len(c.counts) <= i {
		c.counts = append(c.counts, 0)
	}
	c.counts[i]++
}

func (c *slots) snapshot() envoymodel.Slots {
	c.mu.Lock()
	defer c.mu.Unlock()
	return envoymodel.Slots{First: c.first, Counts: slices.Clone(c.counts)}
}
