"""The core: leases in Redis, their heartbeat, unique claims, the child watcher, the option
schema and the admin helpers. It depends on redis-py only and never imports a framework."""
