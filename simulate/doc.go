// Package simulate runs K replicas sharing one global limit in process, in
// virtual time, under a shape of traffic and membership events, with equal
// shares or shares that follow demand, and reports what the cluster admitted
// and what demand sharing cost Consul.
//
// Why a package: it answers an operator's question before any deployment
// (does my traffic shape tolerate local limits, and does demand sharing fix
// it?) and shows the design at scales no test machine runs (K = 1,000). It
// uses the real rule, encodings and report history of package demand, so the
// shares it computes are the ones the daemon computes; what it models is the
// rest: fluid token buckets, a watch delay, and Consul as a map.
//
// It must never reach outside the process or read the clock: a run is a pure
// function of its Config, so the same question always gets the same answer,
// and the figures in testdata/runs.golden hold to the last bit.
package simulate
