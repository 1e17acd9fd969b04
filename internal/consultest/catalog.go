package consultest

import "github.com/hashicorp/consul/api"

// RegisterInstance registers service instance serviceID of serviceName on
// node, with one check whose status is passing or critical. An instance on the
// agent's own node goes through the agent API with a TTL check (the agent's
// anti-entropy would delete a catalog-only registration there); any other node
// is an external node registered in the catalog.
func (a *Agent) RegisterInstance(node, serviceID, serviceName string, passing bool) {
	a.t.Helper()
	a.RegisterAt(node, serviceID, serviceName, "", passing)
}

// RegisterAt is RegisterInstance for an instance with a service address of
// its own, addr, which Consul's DNS answers with (without one, the node's
// address, the same for every instance here).
func (a *Agent) RegisterAt(node, serviceID, serviceName, addr string, passing bool) {
	a.t.Helper()
	var err error
	if node == a.node {
		err = a.client.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID:      serviceID,
			Name:    serviceName,
			Address: addr,
			Check: &api.AgentServiceCheck{
				CheckID: checkID(serviceID),
				TTL:     "24h",
				Status:  status(passing),
			},
		})
	} else {
		_, err = a.client.Catalog().Register(&api.CatalogRegistration{
			Node:    node,
			Address: "127.0.0.1",
			Service: &api.AgentService{ID: serviceID, Service: serviceName, Address: addr},
			Check:   catalogCheck(node, serviceID, passing),
		}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: register %s/%s: %v", node, serviceID, err)
	}
}

// RegisterWeighted is RegisterInstance for an instance that carries Consul
// service weights: weight while its check passes, 1 while it warns.
func (a *Agent) RegisterWeighted(node, serviceID, serviceName string, weight int, passing bool) {
	a.t.Helper()
	weights := api.AgentWeights{Passing: weight, Warning: 1}
	var err error
	if node == a.node {
		err = a.client.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID:      serviceID,
			Name:    serviceName,
			Weights: &weights,
			Check: &api.AgentServiceCheck{
				CheckID: checkID(serviceID),
				TTL:     "24h",
				Status:  status(passing),
			},
		})
	} else {
		_, err = a.client.Catalog().Register(&api.CatalogRegistration{
			Node:    node,
			Address: "127.0.0.1",
			Service: &api.AgentService{ID: serviceID, Service: serviceName, Weights: weights},
			Check:   catalogCheck(node, serviceID, passing),
		}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: register %s/%s with weight %d: %v", node, serviceID, weight, err)
	}
}

// SetCheck sets the status of the check RegisterInstance gave serviceID.
func (a *Agent) SetCheck(node, serviceID string, passing bool) {
	a.t.Helper()
	var err error
	if node == a.node {
		err = a.client.Agent().UpdateTTL(checkID(serviceID), "", status(passing))
	} else {
		_, err = a.client.Catalog().Register(&api.CatalogRegistration{
			Node:    node,
			Address: "127.0.0.1",
			Check:   catalogCheck(node, serviceID, passing),
		}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: set check of %s/%s: %v", node, serviceID, err)
	}
}

// Deregister removes serviceID and its check from node.
func (a *Agent) Deregister(node, serviceID string) {
	a.t.Helper()
	var err error
	if node == a.node {
		err = a.client.Agent().ServiceDeregister(serviceID)
	} else {
		_, err = a.client.Catalog().Deregister(&api.CatalogDeregistration{Node: node, ServiceID: serviceID}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: deregister %s/%s: %v", node, serviceID, err)
	}
}

// catalogCheck is the service check of an instance on an external node.
func catalogCheck(node, serviceID string, passing bool) *api.AgentCheck {
	return &api.AgentCheck{
		Node:      node,
		CheckID:   checkID(serviceID),
		Name:      "consultest " + serviceID,
		Status:    status(passing),
		ServiceID: serviceID,
	}
}

func checkID(serviceID string) string { return "service:" + serviceID }

func status(passing bool) string {
	if passing {
		return api.HealthPassing
	}
	return api.HealthCritical
}
