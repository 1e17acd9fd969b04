// Package xdstest runs a real xDS management server for tests: go-control-plane's
// own ADS server over its snapshot cache, on a real gRPC listener, serving
// RateLimitConfig resources to one node. It records every request of that type
// the server receives, so a test can see ACKs and NACKs from the server's side.
// It is what command xdsserver serves, for tests that run it as a process.
//
// Why a package of its own: source/xds, daemon and e2e all test against a
// management server, and a hand-written one would encode our reading of
// the protocol rather than go-control-plane's behaviour (its snapshot cache
// answers a NACK by sending the same response again, for one). Only tests
// and command xdsserver import it: production code must never depend on it.
package xdstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// Request is one DiscoveryRequest for RateLimitConfig the server received.
type Request struct {
	Stream       int64             `json:"stream"`
	Node         string            `json:"node"`
	NodeMetadata map[string]string `json:"node_metadata,omitempty"` // the node's string-valued metadata
	Version      string            `json:"version"`
	Nonce        string            `json:"nonce"`
	Error        string            `json:"error,omitempty"` // error_detail's message: set on a NACK
	At           time.Time         `json:"at"`
}

// Nack reports whether the request refused the response it answers.
func (r Request) Nack() bool { return r.Error != "" }

// Server is a running management server. Its methods are safe for concurrent
// use.
type Server struct {
	cache  cache.SnapshotCache
	nodeID string
	lis    net.Listener
	grpc   *grpc.Server
	cancel context.CancelFunc
	served chan error

	mu       sync.Mutex
	requests []Request
	headers  map[int64]metadata.MD
}

// Start listens on addr (e.g. "127.0.0.1:0") and serves snapshots to the
// node nodeID. Stop ends it.
func Start(addr, nodeID string) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("start xds server: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cache:   cache.NewSnapshotCache(true, cache.IDHash{}, nil),
		nodeID:  nodeID,
		lis:     lis,
		grpc:    grpc.NewServer(),
		cancel:  cancel,
		served:  make(chan error, 1),
		headers: map[int64]metadata.MD{},
	}
	callbacks := server.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			s.mu.Lock()
			s.headers[id] = md
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(id int64, req *discoverygrpc.DiscoveryRequest) error {
			if req.GetTypeUrl() != resource.RateLimitConfigType {
				return nil
			}
			r := Request{Stream: id, Node: req.GetNode().GetId(), Version: req.GetVersionInfo(),
				Nonce: req.GetResponseNonce(), Error: req.GetErrorDetail().GetMessage(), At: time.Now()}
			for k, v := range req.GetNode().GetMetadata().GetFields() {
				if sv, ok := v.GetKind().(*structpb.Value_StringValue); ok {
					if r.NodeMetadata == nil {
						r.NodeMetadata = map[string]string{}
					}
					r.NodeMetadata[k] = sv.StringValue
				}
			}
			s.mu.Lock()
			s.requests = append(s.requests, r)
			s.mu.Unlock()
			return nil
		},
	}
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(s.grpc, server.NewServer(ctx, s.cache, callbacks))
	go func() { s.served <- s.grpc.Serve(lis) }()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Set makes configs, at version, the snapshot the node gets.
func (s *Server) Set(version string, configs ...*rlsconfv3.RateLimitConfig) error {
	return s.SetWithTTL(version, 0, configs...)
}

// SetWithTTL is Set with a TTL on every resource (0 for none). With a TTL,
// go-control-plane wraps each resource in an envoy.service.discovery.v3.Resource.
func (s *Server) SetWithTTL(version string, ttl time.Duration, configs ...*rlsconfv3.RateLimitConfig) error {
	res := make([]types.ResourceWithTTL, len(configs))
	for i, c := range configs {
		res[i] = types.ResourceWithTTL{Resource: c}
		if ttl > 0 {
			res[i].TTL = &ttl
		}
	}
	snap, err := cache.NewSnapshotWithTTLs(version, map[resource.Type][]types.ResourceWithTTL{resource.RateLimitConfigType: res})
	if err != nil {
		return fmt.Errorf("set snapshot %s: %w", version, err)
	}
	if err := s.cache.SetSnapshot(context.Background(), s.nodeID, snap); err != nil {
		return fmt.Errorf("set snapshot %s: %w", version, err)
	}
	return nil
}

// Requests returns every request for RateLimitConfig received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Nacks returns the requests that refused a response.
func (s *Server) Nacks() []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Nack() {
			out = append(out, r)
		}
	}
	return out
}

// Headers returns the gRPC metadata each stream opened with, by stream id.
func (s *Server) Headers() map[int64]metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int64]metadata.MD, len(s.headers))
	for id, md := range s.headers {
		out[id] = md.Copy()
	}
	return out
}

// Stop ends the server at once, cutting every stream, as a crash would, and
// waits until it has stopped.
func (s *Server) Stop() {
	s.grpc.Stop()
	s.cancel()
	<-s.served
	s.served <- nil // a second Stop returns at once
}

// ParseConfigs reads the RateLimitConfig resources of a snapshot: a YAML (or
// JSON) list whose items are RateLimitConfig messages in protojson's mapping,
// where fields may be spelled as in the proto (requests_per_unit) or in JSON
// (requestsPerUnit), and a unit by name (SECOND) or number (7 for WEEK):
//
//	# one RateLimitConfig per domain
//	- name: users
//	  domain: users
//	  descriptors:
//	    - key: user
//	      rate_limit: {unit: SECOND, requests_per_unit: 10}
//
// An empty document is an empty snapshot.
func ParseConfigs(data []byte) ([]*rlsconfv3.RateLimitConfig, error) {
	var items []any
	if err := yaml.Unmarshal(data, &items); err != nil {
		return nil, fmt.Errorf("parse configs: want a list: %w", err)
	}
	out := make([]*rlsconfv3.RateLimitConfig, 0, len(items))
	var errs []error
	for i, item := range items {
		b, err := json.Marshal(item)
		if err != nil {
			errs = append(errs, fmt.Errorf("config %d: %w", i, err))
			continue
		}
		c := &rlsconfv3.RateLimitConfig{}
		if err := protojson.Unmarshal(b, c); err != nil {
			errs = append(errs, fmt.Errorf("config %d: %w", i, err))
			continue
		}
		out = append(out, c)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("parse configs: %w", errors.Join(errs...))
	}
	return out, nil
}
