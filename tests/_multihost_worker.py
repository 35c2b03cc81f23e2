"""One process of `tests/test_multihost.py`: `python _multihost_worker.py RANK PORT OUT`.

Two such processes with two CPU devices each form one 4-device mesh through
`jax.distributed` (gloo collectives) and run `jaxdae.batch_map` over it, each feeding its
half of the batch, as on a multi-host GPU cluster.
"""

import sys
from pathlib import Path

import jax

RANK, PORT, OUT = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_num_cpu_devices", 2)
# Before anything creates an array (the test module's system does).
jax.distributed.initialize(
    coordinator_address=f"localhost:{PORT}", num_processes=2, process_id=RANK
)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import jaxdae  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_multihost import batch, ensemble, run  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 4
mesh = jax.make_mesh((4,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
sharding = jaxdae.batch_sharding(mesh)
args = batch()
size = args[0].shape[0]
mine = slice(RANK * size // 2, (RANK + 1) * size // 2)  # this process's rows
placed = [jax.make_array_from_process_local_data(sharding, np.asarray(x[mine])) for x in args]
results = {
    "vmap": jaxdae.batch_map(run, *placed, mesh=mesh, chunk_size=1),
    "ensemble": jaxdae.batch_map(ensemble, *placed[1:], mesh=mesh, ensemble=True),
}
np.savez(
    OUT / f"rank{RANK}.npz",
    **{
        name: np.asarray(multihost_utils.process_allgather(value, tiled=True))
        for name, value in results.items()
    },
)
