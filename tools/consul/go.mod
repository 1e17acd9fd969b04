// This module exists only to build a Consul agent for the test suite. It is kept
// out of the main module so Consul's dependencies never reach sharelimit's go.sum.
module github.com/sharelimit/sharelimit/tools/consul

go 1.20

require (
	github.com/hashicorp/consul v1.14.8
	github.com/hashicorp/consul/api v1.18.1
)
