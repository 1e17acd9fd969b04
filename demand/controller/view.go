package controller

// The controller's admin view: what the admin pages show of one service's
// demand sharing (Controller.Status), as JSON and on the status page.

// Status is one service's demand sharing as this replica sees it.
type Status struct {
	Leading bool `json:"leading"` // this replica divides
	// Leader is the node whose parameters are in force; "" without any.
	Leader           string  `json:"leader,omitempty"`
	ParamsAgeSeconds float64 `json:"params_age_seconds"`
	// Stale: the parameters are too old to use; equal shares apply.
	Stale  bool      `json:"stale"`
	Writes uint64    `json:"writes"`
	Errors uint64    `json:"write_errors"`
	Rules  []RuleRow `json:"rules"`
	// Division is every replica's demand and share in the last division,
	// per rule, busiest first and at most 64 per rule; only on the leader,
	// which alone reads every report.
	Division []Replica `json:"division,omitempty"`
	// Counted is how the parameters in force counted this replica's
	// report: "counted", "not counted" (it takes at most its equal share)
	// or "unknown" (a report under its name it did not write, or no longer
	// remembers: it takes the floor of its share); "" without parameters.
	Counted string `json:"counted,omitempty"`
	// WriteError is why this replica's last report write failed, while
	// no later one has succeeded.
	WriteError string `json:"write_error,omitempty"`
	// BadReports are the reports the leader's last division could not use
	// (their replicas count at their equal shares); only on the leader.
	BadReports []BadReport `json:"bad_reports,omitempty"`
}

// BadReport is a report the leader could not use, and why.
type BadReport struct {
	Node  string `json:"node"`
	Cause string `json:"cause"` // the cause label of sharelimit_demand_bad_reports_total
	Error string `json:"error"`
}

// Replica is one replica in the leader's last division of a rule.
type Replica struct {
	Rule string `json:"rule"`
	// Value is a per-value rule's hot value ("key=value, ..." as a request
	// named it, or its ID); "" for a rule with one bucket.
	Value    string  `json:"value,omitempty"`
	Node     string  `json:"node"`
	Units    uint32  `json:"units"`
	Offered  float64 `json:"offered_per_second"`
	Admitted float64 `json:"admitted_per_second"`
	Share    float64 `json:"share"`
	Absent   bool    `json:"absent,omitempty"` // no usable report: counted at its equal share
}

// RuleRow is one demand-shared rule on this replica.
type RuleRow struct {
	Rule string `json:"rule"`
	// Value is set on the rows of a per-value rule's hot values; the row of
	// the rule itself (every other value, at the equal share) has none.
	Value    string  `json:"value,omitempty"`
	Offered  float64 `json:"offered_per_second"`  // smoothed, this replica
	Admitted float64 `json:"admitted_per_second"` // smoothed, this replica
	Share    float64 `json:"share"`               // the weight in force
	Equal    float64 `json:"equal_share"`         // the membership weight
	// ClusterAdmittedRatio is the cluster's admitted rate ÷ L from the
	// reports the parameters in force were divided from; 0 without them.
	ClusterAdmittedRatio float64 `json:"cluster_admitted_ratio"`
}
