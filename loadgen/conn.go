package loadgen

import (
	"context"
	"fmt"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// connectTimeout bounds the probe call that checks each connection before load.
const connectTimeout = 5 * time.Second

// grpcTarget turns an address into a grpc-go target. A bare host:port goes
// through the passthrough resolver: no DNS lookups and no resolver goroutine.
func grpcTarget(addr string) string {
	if strings.HasPrefix(addr, "unix:") || strings.Contains(addr, "://") {
		return addr
	}
	return "passthrough:///" + addr
}

// dial opens cfg.Conns connections to every target, interleaved so that
// consecutive workers land on different targets, and proves each one answers
// ShouldRateLimit before any load is measured.
func dial(ctx context.Context, cfg *Config, keys *keySpace) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, cfg.Conns*len(cfg.Targets))
	names := make([]string, 0, cap(conns))
	for range cfg.Conns {
		for _, t := range cfg.Targets {
			cc, err := grpc.NewClient(grpcTarget(t), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newClientCodec())))
			if err != nil {
				closeConns(conns)
				return nil, fmt.Errorf("dial %s: %w", t, err)
			}
			conns = append(conns, cc)
			names = append(names, t)
		}
	}
	req := newRequestBuilder(keys, cfg.Domain, cfg.Descriptors, cfg.HitsAddend).build(0)
	for i, cc := range conns {
		if err := probe(ctx, cc, req); err != nil {
			closeConns(conns)
			return nil, fmt.Errorf("probe %s: %w", names[i], err)
		}
	}
	return conns, nil
}

// probe makes one fail-fast call, so that a refused connection, a server that does
// not implement the service, or one that rejects the request shape, stops the run
// with the server's own message instead of a table of errors.
func probe(ctx context.Context, cc *grpc.ClientConn, req *rlsv3.RateLimitRequest) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	var resp rlsv3.RateLimitResponse
	return cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, req, &resp)
}

func closeConns(conns []*grpc.ClientConn) {
	for _, cc := range conns {
		_ = cc.Close() // only fails when already closed
	}
}
