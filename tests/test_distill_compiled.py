"""--compile (distill/core/compiled.py): compiled decoder layers train as the plain ones do, and a failing
compile falls back to the plain layers, says why, and the run trains on. The CUDA backend itself runs
only on a lent GPU; here `aot_eager` runs the same tracing (dynamo + AOTAutograd, dynamic shapes) without
generating kernels, and a backend that raises stands in for a compiler that fails there."""

import torch
from torch._dynamo.utils import counters

from swiftkv.distill.core.compiled import CompiledLayers
from swiftkv.distill.core.loss import BatchSizes
from swiftkv.distill.core.trainer import prepare, train_step
from swiftkv.distill.parallel.world import World
from tests.test_distill_train import blocks_for, run_settings
from tests.tiny import tiny_student


def losses(tmp_path, steps: int, backend=None, log=None, **overrides) -> tuple[list[float], CompiledLayers]:
    torch.manual_seed(0)
    model = tiny_student()
    train = blocks_for(model, seq_len=32, count=2 * steps)
    settings = run_settings(tmp_path, batch_size=2, micro_batch=2, **overrides)
    distiller, optimizer, step, compiled = prepare(settings, model, train, World())
    if backend is not None:
        compiled = CompiledLayers(model, True, log or print, backend=backend)
    values = []
    for k in range(steps):
        blocks = train.select(slice(2 * k, 2 * k + 2))
        values.append(
            compiled.run(
                train_step, distiller, model, optimizer, blocks, BatchSizes.of(blocks), step, World()
            )
        )
    return values, compiled


def test_compiled_layers_train_as_the_plain_ones(tmp_path):
    plain, _ = losses(tmp_path, 3)
    traced, compiled = losses(tmp_path, 3, backend="aot_eager")
    assert compiled.active
    assert torch.allclose(torch.tensor(traced), torch.tensor(plain), rtol=1e-5, atol=1e-6)


def test_a_failing_compile_falls_back_to_the_plain_layers_and_says_why(tmp_path):
    def broken(graph, inputs):
        raise RuntimeError("no kernels for this device")

    said = []
    plain, _ = losses(tmp_path, 3)
    fallen, compiled = losses(tmp_path, 3, backend=broken, log=said.append)
    assert not compiled.active and fallen == plain  # the failed attempt left no gradient behind
    assert len(said) == 1 and "--compile: the compiled layers failed" in said[0] and "no kernels" in said[0]


def test_an_adapted_student_compiles_every_layer_whole(tmp_path):
    """The student-only adapters read which path runs (`on_student_path`) inside each compiled layer; a
    value dynamo cannot trace there broke every layer into pieces (29 graphs, 29 breaks at N = 15)."""
    torch._dynamo.reset()
    counters.clear()
    said = []
    plain, _ = losses(tmp_path, 3, trainable="lora")
    traced, compiled = losses(tmp_path, 3, backend="aot_eager", log=said.append, trainable="lora")
    assert compiled.active
    assert torch.allclose(torch.tensor(traced), torch.tensor(plain), rtol=1e-5, atol=1e-6)
    assert len(said) == 1 and "0 graph break(s)" in said[0], said
