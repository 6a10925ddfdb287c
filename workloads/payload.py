"""The launched file in every mode: its first act is the ready line, then it loads the body.

``python3 -I -S <dir>/workloads/payload.py --workload W --seed N --scale S --root DIR
--family F``, with the ``workloads`` directory beside it (every mode binds the whole directory,
read-only; ``--family``, the module that declares W, is the only one of them it imports).
Ready is timed to the ready line, so only the interpreter's own start precedes it: the body
(``workloads.protocol`` and its workload's modules) is imported after it, outside every clock,
from the checked-hash bytecode the harness compiled into this directory beforehand
(``worker/bytecode.py``; from source where there is none or it no longer matches), and writes
no bytecode (the directory may be read-only; a ``__pycache__`` must never appear in a
workspace). The host never imports this file.
"""

import sys

if __name__ == "__main__":
    sys.stdout.write('{"op": "ready"}\n')
    sys.stdout.flush()
    sys.dont_write_bytecode = True
    sys.path.insert(0, (__file__.rpartition("/")[0] or ".") + "/..")
    from workloads.protocol import main

    main()  # leaves the process with the protocol's status
