"""``sandbench vm prepare`` and ``sandbench vm status``: guest kernel, initramfs, accelerator."""

from __future__ import annotations

import json

import click

from worker.vm import accel, guest, qemu


@click.group("vm")
def vm_group() -> None:
    """The VM modes' guest: kernel, initramfs, accelerator (set-up, never timed)."""


@vm_group.command("prepare")
@click.option("--force", is_flag=True, help="Rebuild even if a usable guest is prepared.")
@click.option("--no-probe", is_flag=True, help="Skip the accelerator probe boot(s).")
def prepare_command(force: bool, no_probe: bool) -> None:
    """Fetch Debian's kernel package, build the initramfs, probe KVM (falling back to TCG)."""
    click.echo(f"guest directory: {guest.vm_home()}")
    prepared = guest.prepare_guest(force=force)
    click.echo(f"kernel {prepared.kernel_version}: {prepared.vmlinuz}")
    click.echo(f"initramfs ({len(prepared.modules)} modules): {prepared.initrd}")
    if no_probe:
        return
    if qemu.qemu_binary() is None:
        click.echo(f"accelerator: not probed ({qemu.QEMU} not installed)")
        return
    verdict = accel.detect_accel(prepared, refresh=force)
    click.echo(f"accelerator: {verdict['accel']} (QEMU {qemu.qemu_version()})")
    probes: list[dict[str, object]] = verdict.get("probes", [])  # type: ignore[assignment]
    for probe in probes:
        click.echo(f"  probe {probe['accel']}: {str(probe['detail'])[:120]} ({probe['seconds']} s)")


@vm_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def status_command(as_json: bool) -> None:
    """What is prepared, what is missing, and the cached accelerator verdict."""
    prepared = guest.load_guest()
    status: dict[str, object] = {
        "home": str(guest.vm_home()),
        "qemu": qemu.qemu_version() or None,
        "problem": guest.guest_problem(prepared),
        "guest": guest.guest_dict(prepared) if prepared else None,
        **_cached_accel(prepared),
    }
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    for key, value in status.items():
        click.echo(f"{key}: {value if not isinstance(value, dict) else json.dumps(value)}")


def _cached_accel(prepared: guest.Guest | None) -> dict[str, object]:
    """The cached accelerator verdict and, for a fallback, KVM's reason (never probes)."""
    verdict = accel.cached_verdict(prepared) if prepared is not None else None
    if verdict is None:
        return {"accel": None, "accel_probe": "not probed yet (sandbench vm prepare)"}
    return {
        "accel": verdict.get("accel"),
        "accel_probe": accel.probe_summary(verdict),
        "kvm_unusable": accel.fallback_reason(verdict),
    }


def register(main: click.Group) -> None:
    """Attach ``vm`` to the top-level group."""
    main.add_command(vm_group)
