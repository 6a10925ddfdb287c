"""The host side of one environment: runner, modes, cgroup quota, preflight, host facts."""
