"""The host side: the gate, the runner, modes, cgroup quota, host facts and the fleet task."""
