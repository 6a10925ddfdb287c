"""Guest preparation and QEMU plumbing shared by the VM modes (``worker/modes/vm.py``)."""
