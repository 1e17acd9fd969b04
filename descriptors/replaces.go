package descriptors

// Replacements calls drop for every pair of a request's n limits where the
// limit at by names the limit at dropped in its replaces. limit(i) is nil for a
// descriptor without a limit. The engine's Decide and Explain share it, so what explain
// reports is what a decision does.
//
// An unlimited limit is never dropped, though its own replaces count: upstream
// gathers every matched limit's replaces, unlimited ones included, and sets
// the unlimited ones aside before it drops what is named, so an unlimited
// descriptor always answers OK with limit_remaining MaxUint32 and is never a
// quota descriptor.
func Replacements(n int, limit func(int) *Limit, drop func(by, dropped int, name string)) {
	for i := 0; i < n; i++ {
		li := limit(i)
		if li == nil || len(li.replaces) == 0 {
			continue
		}
		for j := 0; j < n; j++ {
			lj := limit(j)
			if j == i || lj == nil || lj.name == "" || lj.unlimited {
				continue
			}
			for _, name := range li.replaces {
				if name == lj.name {
					drop(i, j, name)
				}
			}
		}
	}
}
