package interop

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const rlsPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// request is a RateLimitRequest as the client scripts take it (JSON).
type request struct {
	Domain      string `json:"domain"`
	Descriptors []desc `json:"descriptors"`
	HitsAddend  uint32 `json:"hits_addend,omitempty"`
}

type desc struct {
	Entries    [][2]string `json:"entries"`
	Limit      *override   `json:"limit,omitempty"`
	HitsAddend *uint64     `json:"hits_addend,omitempty"` // a UInt64Value: set even when 0
}

type override struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            int32  `json:"unit"`
}

// Units and codes as on the wire.
const (
	second = int32(typev3.RateLimitUnit_SECOND)
	minute = int32(typev3.RateLimitUnit_MINUTE)
	hour   = int32(typev3.RateLimitUnit_HOUR)
	day    = int32(typev3.RateLimitUnit_DAY)

	codeOK   = int(rlsv3.RateLimitResponse_OK)
	codeOver = int(rlsv3.RateLimitResponse_OVER_LIMIT)
)

// rq is a request in the interop domain.
func rq(ds ...desc) request { return request{Domain: "interop", Descriptors: ds} }

// ds is a descriptor of key, value pairs.
func ds(kv ...string) desc {
	d := desc{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, [2]string{kv[i], kv[i+1]})
	}
	return d
}

func (d desc) hits(n uint64) desc { d.HitsAddend = &n; return d }

func (d desc) limit(rpu uint32, unit int32) desc {
	d.Limit = &override{RequestsPerUnit: rpu, Unit: unit}
	return d
}

func (r request) hits(n uint32) request { r.HitsAddend = n; return r }

// body is r as a gRPC message: the 5-byte prefix and the protobuf, marshalled
// by the go-control-plane types, for the raw HTTP/2 clients.
func (r request) body() []byte {
	m := &rlsv3.RateLimitRequest{Domain: r.Domain, HitsAddend: r.HitsAddend}
	for _, d := range r.Descriptors {
		pd := &commonv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			pd.Entries = append(pd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
		}
		if d.Limit != nil {
			pd.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: d.Limit.RequestsPerUnit, Unit: typev3.RateLimitUnit(d.Limit.Unit)}
		}
		if d.HitsAddend != nil {
			pd.HitsAddend = wrapperspb.UInt64(*d.HitsAddend)
		}
		m.Descriptors = append(m.Descriptors, pd)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// answer is a decoded RateLimitResponse: what the tests compare.
type answer struct {
	Overall  int      `json:"overall"`
	Statuses []status `json:"statuses"`
}

type status struct {
	Code      int    `json:"code"`
	Remaining uint32 `json:"remaining"`
	Limit     *limit `json:"limit"`
}

type limit struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            int32  `json:"unit"`
	Name            string `json:"name"`
}

// result is one call's outcome: a gRPC status code and, with OK, the answer.
type result struct {
	Code    int     `json:"code"`
	Details string  `json:"details"`
	Resp    *answer `json:"resp"`
}

// String shows r with runs of equal statuses written once, as N×{...}.
func (r result) String() string {
	if r.Resp == nil {
		return fmt.Sprintf("%s %q", codes.Code(r.Code), r.Details)
	}
	return "OK " + r.Resp.String()
}

func (a *answer) String() string {
	var parts []string
	for i := 0; i < len(a.Statuses); {
		j := i + 1
		for j < len(a.Statuses) && reflect.DeepEqual(a.Statuses[j], a.Statuses[i]) {
			j++
		}
		b, _ := json.Marshal(a.Statuses[i])
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%d×%s", j-i, b))
		} else {
			parts = append(parts, string(b))
		}
		i = j
	}
	return fmt.Sprintf("{overall:%d statuses:[%s]}", a.Overall, strings.Join(parts, " "))
}

// decodeAnswer decodes a gRPC-framed RateLimitResponse with the
// go-control-plane types.
func decodeAnswer(body []byte) (*answer, error) {
	if len(body) < 5 {
		return nil, fmt.Errorf("%d bytes: no gRPC message", len(body))
	}
	if body[0] != 0 {
		return nil, fmt.Errorf("compressed flag %d", body[0])
	}
	if n := binary.BigEndian.Uint32(body[1:5]); int(n) != len(body)-5 {
		return nil, fmt.Errorf("message of %d bytes in a body of %d", n, len(body))
	}
	var m rlsv3.RateLimitResponse
	if err := proto.Unmarshal(body[5:], &m); err != nil {
		return nil, err
	}
	a := &answer{Overall: int(m.OverallCode), Statuses: []status{}}
	for _, s := range m.Statuses {
		st := status{Code: int(s.Code), Remaining: s.LimitRemaining}
		if l := s.CurrentLimit; l != nil {
			st.Limit = &limit{RequestsPerUnit: l.RequestsPerUnit, Unit: int32(l.Unit), Name: l.Name}
		}
		a.Statuses = append(a.Statuses, st)
	}
	return a, nil
}

// want is what a call must get: a gRPC code, a part of its message, and
// with OK, the whole answer.
type want struct {
	code   codes.Code
	detail string
	resp   *answer
}

func (w want) String() string {
	if w.code != codes.OK {
		return fmt.Sprintf("%s (%q)", w.code, w.detail)
	}
	return "OK " + w.resp.String()
}

// answered: OK, with overall and these statuses.
func answered(overall int, sts ...status) want {
	return want{code: codes.OK, resp: &answer{Overall: overall, Statuses: append([]status{}, sts...)}}
}

// failed: the gRPC code, with detail in its message.
func failed(code codes.Code, detail string) want { return want{code: code, detail: detail} }

// Statuses.
func okRemaining(rem uint32, l *limit) status { return status{Code: codeOK, Remaining: rem, Limit: l} }
func over(l *limit) status                    { return status{Code: codeOver, Limit: l} }
func perDay(n uint32) *limit                  { return &limit{RequestsPerUnit: n, Unit: day} }
func perMinute(n uint32) *limit               { return &limit{RequestsPerUnit: n, Unit: minute} }
func perSecond(n uint32) *limit               { return &limit{RequestsPerUnit: n, Unit: second} }

var (
	unlimited = status{Code: codeOK, Remaining: math.MaxUint32}
	noRule    = status{Code: codeOK} // a descriptor no rule matches
)

// matches reports how got differs from w, or "".
func (w want) mismatch(got result) string {
	if codes.Code(got.Code) != w.code {
		return fmt.Sprintf("got %s %q, want %s", codes.Code(got.Code), got.Details, w)
	}
	if !strings.Contains(got.Details, w.detail) {
		return fmt.Sprintf("got message %q, want one containing %q", got.Details, w.detail)
	}
	if w.code == codes.OK && !reflect.DeepEqual(got.Resp, w.resp) {
		return fmt.Sprintf("got %s, want %s", got, w)
	}
	return ""
}

// expect checks each result against its want.
func expect(t *testing.T, who string, got []result, wants []want) {
	t.Helper()
	if len(got) != len(wants) {
		t.Fatalf("%s: %d results, want %d: %v", who, len(got), len(wants), got)
	}
	for i := range wants {
		if m := wants[i].mismatch(got[i]); m != "" {
			t.Errorf("%s: call %d: %s", who, i, m)
		}
	}
}
