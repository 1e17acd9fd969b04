package xdstest

import (
	"encoding/json"
	"io"
	"net/http"
)

// maxBody caps a snapshot sent to the control endpoint.
const maxBody = 64 << 20

// Handler is the server's HTTP control endpoint:
//
//	PUT /snapshot?version=V   body: configs as ParseConfigs reads them; 204, or 400 with the error
//	GET /requests             every RateLimitConfig request received, as a JSON list of Request
//	GET /nacks                the requests that were NACKs, likewise
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /snapshot", func(w http.ResponseWriter, r *http.Request) {
		version := r.URL.Query().Get("version")
		if version == "" {
			http.Error(w, "missing ?version=", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		configs, err := ParseConfigs(body)
		if err == nil {
			err = s.Set(version, configs...)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /requests", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.Requests()) })
	mux.HandleFunc("GET /nacks", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.Nacks()) })
	return mux
}

func writeJSON(w http.ResponseWriter, reqs []Request) {
	if reqs == nil {
		reqs = []Request{}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(reqs)
}
