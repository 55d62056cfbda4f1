"""plan and apply: from hosts.yaml's deployments to healthy services, idempotently."""
