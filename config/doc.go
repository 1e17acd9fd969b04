// Package config holds the daemon's settings. They are read once, at start-up,
// from flags, SHARELIMIT_* environment variables and, for a container that
// still carries envoyproxy/ratelimit's environment, upstream's own variables
// (a flag wins over its SHARELIMIT_* variable, which wins over upstream's
// name), and checked by Validate before anything starts. Nothing re-reads the
// environment later: a running daemon's settings are exactly what it logged at
// start. ApplyEnv, the rule that maps flags to variables, is shared with the
// other subcommands that read their flags from the environment (sharelimit
// bench).
//
// Why a package: the precedence of flags, variables and upstream's names is
// one rule, and the daemon, the subcommands and the README's tests all read
// it here, so none of them can drift from it.
//
// It must never be consulted after start-up, read the environment behind
// the caller's back (Parse reads only what getenv gives it), or start
// anything: it opens no listener, connection or file.
package config
