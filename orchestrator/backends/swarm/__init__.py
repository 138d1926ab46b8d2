"""Docker Swarm: sandboxes as one-replica services spread over a Swarm's nodes, reached through a relay on each."""
