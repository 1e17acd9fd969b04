// Package daemon assembles sharelimit's parts into the running daemon and owns
// their lifetimes: the engine and its buckets, the config source, the
// membership source, each Consul service's demand controller, the gRPC and
// admin servers, the sweeper and the stop sequence. main parses settings and
// hands them to New; every goroutine the daemon needs is started by Run and
// has ended when Run returns.
//
// It is its own package so that wiring stays apart from what is wired: it
// must hold no policy of its own (demand sharing's is demand/controller's,
// membership's is membership's), never hold a rule or a bucket itself, and
// never be imported by anything but cmd.
package daemon
