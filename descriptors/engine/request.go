package engine

import (
	"errors"
	"fmt"
	"math"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
)

// Caps on one request. Envoy's largest honest requests are far below them; they
// bound the work a broken or hostile caller can ask for. Exceeding one is bad
// input (InvalidArgument), never a crash.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxKeyBytes    = 256
	MaxValueBytes  = 4096
	MaxHits        = math.MaxUint32
)

// Code is a decision's code: the wire enum, so the server passes it through.
type Code = rlsv3.RateLimitResponse_Code

// Codes of a decision.
const (
	OK        = rlsv3.RateLimitResponse_OK
	OverLimit = rlsv3.RateLimitResponse_OVER_LIMIT
)

// ErrInvalidRequest is matched (errors.Is) by every *RequestError.
var ErrInvalidRequest = errors.New("invalid request")

// RequestError is bad input in a request, naming the field at fault.
type RequestError struct {
	Field string
	Msg   string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *RequestError) Is(target error) bool { return target == ErrInvalidRequest }

// ValidateRequest checks a request against the caps and the rules of SPEC
// 2.4 without deciding it: the *RequestError it returns is what Decide
// returns for the request. It is a flat list of checks, one per field.
func ValidateRequest(domain string, descs []*commonv3.RateLimitDescriptor) error {
	if domain == "" {
		return &RequestError{"domain", "must not be empty"}
	}
	if len(descs) == 0 {
		return &RequestError{"descriptors", "at least one descriptor is required"}
	}
	if len(descs) > MaxDescriptors {
		return &RequestError{"descriptors", fmt.Sprintf("%d descriptors, at most %d allowed", len(descs), MaxDescriptors)}
	}
	for i, d := range descs {
		if d == nil {
			return &RequestError{fmt.Sprintf("descriptors[%d]", i), "is null"}
		}
		if len(d.Entries) == 0 {
			return &RequestError{fmt.Sprintf("descriptors[%d].entries", i), "at least one entry is required"}
		}
		if len(d.Entries) > MaxEntries {
			return &RequestError{fmt.Sprintf("descriptors[%d].entries", i), fmt.Sprintf("%d entries, at most %d allowed", len(d.Entries), MaxEntries)}
		}
		for j, en := range d.Entries {
			switch {
			case en == nil:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d]", i, j), "is null"}
			case en.Key == "":
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "must not be empty"}
			case len(en.Key) > MaxKeyBytes:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), fmt.Sprintf("%d bytes, at most %d allowed", len(en.Key), MaxKeyBytes)}
			case len(en.Value) > MaxValueBytes:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), fmt.Sprintf("%d bytes, at most %d allowed", len(en.Value), MaxValueBytes)}
			}
		}
		if d.HitsAddend != nil && d.HitsAddend.Value > MaxHits {
			return &RequestError{fmt.Sprintf("descriptors[%d].hits_addend", i), fmt.Sprintf("%d, at most %d allowed", d.HitsAddend.Value, uint64(MaxHits))}
		}
		if o := d.Limit; o != nil {
			if o.Unit <= 0 || o.Unit > 6 {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.unit", i), fmt.Sprintf("unit %s is not a valid unit", o.Unit)}
			}
			if o.RequestsPerUnit == 0 {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.requests_per_unit", i), "must be at least 1"}
			}
			if m := o.GetUnitMultiplier().GetValue(); !descriptors.WindowOK(descriptors.Unit(o.Unit), m) {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.unit_multiplier", i),
					fmt.Sprintf("a window of %d %ss is longer than the %d-year maximum", m, descriptors.Unit(o.Unit), descriptors.MaxWindow/descriptors.Year.Duration())}
			}
		}
	}
	return nil
}
