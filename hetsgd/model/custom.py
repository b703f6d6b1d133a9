"""A user's own ``nn.Module``, built from ``model._target_`` by ``hydra.utils.instantiate``.

The factory (a function or an ``nn.Module`` class) gets ``model.kwargs``, and what the data
says: ``in_features``, ``input_shape`` (the image's ``(C, H, W)`` on image sets, else
``(in_features,)``), ``num_classes``, ``num_outputs`` (the width of the last layer: 1 for a binary
task, else the classes; a binary model may return 2 logits too, :class:`LogitsOf`) and ``task``
(``binary``, ``multiclass`` or ``multilabel``). Each goes only to a parameter its signature
names so (a kwarg the user gives wins; a ``**kwargs`` catches none, as it cannot say what it
takes); ``model.data_args`` passes them under the factory's own
names (``{d_in: in_features, d_out: num_outputs}``) and keeps one from a parameter
(``{in_features: null}``).

Like every model here, a custom one receives a flat batch ``[B, in_features]`` (a sparse CSR
tensor on a sparse dataset; int64 where the data is a file's integers, token ids for an
``nn.Embedding``, which only a custom model gets as they are: :mod:`hetsgd.data.prepare`; its
probe below is then an int64 batch) and must return logits ``[B, num_outputs]`` (``[B, 2]`` also
for a binary task), or an output object
holding them as ``logits`` (HuggingFace's ``ModelOutput``, a dataclass, a dict), which
:class:`LogitsOf` unwraps for every engine. An image model reshapes the batch itself, e.g. with
``nn.Unflatten(1, input_shape)`` as its first layer, as the in-tree ones do. Every process
(workers, ranks, the evaluator) builds the model from the config under the same seed, so the
factory must draw its initial weights from torch's global generator only.

Every engine keeps the model in one float32 vector: floating parameters and buffers of another
precision are converted with ``.float()``; a model with other (complex, integer) parameters is
refused. Before training, one forward pass on two zero examples checks the output's shape, so a
wrong model is one error line naming the target instead of a traceback in a worker.

The user's code runs bounded (:func:`_bounded`): whatever it raises, ``SystemExit`` and
``KeyboardInterrupt`` included, and a call that never returns, fail the run with the target
named, in whichever process builds the model (the coordinator, each worker, the evaluator).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch import nn

from hetsgd.bounded import bounded
from hetsgd.config.problem import CustomModelConfig
from hetsgd.errors import UserError
from hetsgd.targets import locate, raised

KEY = "model._target_"

PROBE_BATCH = 2


def data_arguments(num_features: int, num_outputs: int, image_shape: tuple[int, ...] | None,
                   task: str) -> dict[str, Any]:
    """What the data says about the model, under the names a factory may take."""
    return {"in_features": num_features,
            "input_shape": tuple(image_shape) if image_shape is not None else (num_features,),
            "num_classes": 2 if task == "binary" else num_outputs,
            "num_outputs": num_outputs,
            "task": task}


def _given(cfg: CustomModelConfig, factory: Any, offered: dict[str, Any]) -> dict[str, Any]:
    """What the data says (``offered``) that ``factory`` gets: each that its signature names
    so, unless the user gives it, then ``model.data_args``'s entries, each checked against the
    signature (any name goes to a ``**kwargs``, or to a signature that cannot be read)."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        parameters = None
    named = {p.name for p in parameters or ()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    open_ended = parameters is None or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                           for p in parameters)
    given = {name: value for name, value in offered.items()
             if name in named and name not in cfg.kwargs}
    for parameter, size in cfg.data_args.items():
        said = f"model.data_args.{parameter}={'null' if size is None else size}"
        if not open_ended and parameter not in named:
            raise UserError(f"{said}: {cfg._target_} has no parameter {parameter!r} (it takes: "
                            f"{', '.join(sorted(named)) or 'none by name'})")
        if parameter in cfg.kwargs:
            raise UserError(f"{said}: model.{parameter} is given too; give one of them")
        if size is None:
            given.pop(parameter, None)
        else:
            given[parameter] = offered[size]
    return given


def _check_parameters(target: str, module: nn.Module) -> None:
    params = list(module.named_parameters())
    if not params:
        raise UserError(f"model._target_={target}: the {type(module).__name__} it returns has no "
                        "parameters to train")
    for name, param in params:
        if param.dtype != torch.float32:
            raise UserError(f"model._target_={target}: parameter {name!r} is {param.dtype}; "
                            "hetsgd trains real floating-point parameters (kept as float32)")


def logits_of(out: Any) -> Any:
    """The logits in a model's output: the output itself, or the ``logits`` an output object
    (HuggingFace's ``ModelOutput``, a dataclass) or a mapping holds."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        return out.get("logits", out)
    return getattr(out, "logits", out)


class LogitsOf(nn.Module):
    """A model whose forward returns an output object holding ``logits``, returning the logits
    alone: so that the step, the evaluation and the cost model, on every engine, read a tensor.
    With ``pair``, a binary model's two logits ``[B, 2]`` (a factory written for ``num_classes``
    outputs, as torchvision's and timm's are) become the one ``[B, 1]`` the binary loss takes:
    their difference, whose sigmoid is the softmax's probability of class 1, so the loss is the
    two-class cross-entropy the factory was written for."""

    def __init__(self, model: nn.Module, pair: bool = False) -> None:
        super().__init__()
        self.model = model
        self.pair = pair

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = logits_of(self.model(x))
        return logits[:, 1:] - logits[:, :1] if self.pair else logits


def _probe(target: str, module: nn.Module, num_features: int, num_outputs: int,
           task: str, input_dtype: torch.dtype) -> nn.Module:
    """One forward on two zero examples, in training mode, its output's shape checked; the
    buffers (BatchNorm's running statistics) are restored afterwards. The module, in
    :class:`LogitsOf` where it returns an output object."""
    device = next(module.parameters()).device
    saved = [buffer.clone() for buffer in module.buffers()]
    try:
        with torch.no_grad():
            out = module(torch.zeros(PROBE_BATCH, num_features, dtype=input_dtype,
                                     device=device))
    except Exception as exc:
        kept = ("" if input_dtype.is_floating_point else f" (the data's integers, kept as "
                f"{input_dtype}: dataset.scale=standard gives float32 features instead)")
        raise UserError(f"model._target_={target}: its forward on a batch [{PROBE_BATCH}, "
                        f"{num_features}] raised {type(exc).__name__}: {exc}"
                        .replace("\n", " ") + kept) from None
    finally:
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), saved):
                buffer.copy_(value)
    expected = (PROBE_BATCH, num_outputs)
    logits = logits_of(out)
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else None
    if shape == expected:
        return module if logits is out else LogitsOf(module)
    if task == "binary" and shape == (PROBE_BATCH, 2):
        return LogitsOf(module, pair=True)
    held = "" if logits is out else f"a {type(out).__name__} whose logits are "
    got = held + (f"[{', '.join(map(str, logits.shape))}] logits"
                  if isinstance(logits, torch.Tensor) else f"a {type(logits).__name__}")
    needs = ("the task is binary, so the model must return 1 logit per example, [B, 1], or "
             "one per class, [B, 2]"
             if task == "binary" else
             f"the data has {num_outputs} {'labels' if task == 'multilabel' else 'classes'}, "
             f"so the model must return [B, {num_outputs}]")
    raise UserError(f"model._target_={target}: on a batch [{PROBE_BATCH}, {num_features}] it "
                    f"returns {got}; {needs}")


def check_token_ids(module: nn.Module, features: Sequence[torch.Tensor | None]) -> None:
    """Integer features are token ids that the model's ``nn.Embedding`` looks up: an id outside
    its rows would fail every worker's first step with torch's bare ``index out of range in
    self``, so the data's ids are checked once, as it loads, against the largest embedding
    (a smaller one may be another lookup, positions say: its misses still fail in the step)."""
    sizes = [m.num_embeddings for m in module.modules()
             if isinstance(m, nn.Embedding | nn.EmbeddingBag)]
    ids = [x for x in features if x is not None and not x.is_floating_point() and x.numel()]
    if not sizes or not ids:
        return
    low, high, rows = min(int(x.min()) for x in ids), max(int(x.max()) for x in ids), max(sizes)
    if low < 0 or high >= rows:
        raise UserError(f"the data's token ids run from {low} to {high}, but the model's largest "
                        f"embedding has {rows} rows (ids 0 to {rows - 1}): build it with "
                        f"num_embeddings of at least {high + 1}, or map the ids into its range")


def _raised(target: str, exc: BaseException, doing: str = "building it") -> UserError:
    return raised(KEY, target, exc, doing)


def _bounded(target: str, timeout_s: float, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` run bounded (:func:`hetsgd.bounded.bounded`: a thread of its own, waited on
    for at most ``timeout_s``, its exits its own); whatever it raises, one line naming the
    target."""
    return bounded(build, timeout_s, f"model._target_={target}: importing it, calling it and a "
                   f"first forward did not end within model.build_timeout_s={timeout_s:g} s "
                   "(raise it if building the model is only slow)", f"building {target}",
                   lambda exc: exc if isinstance(exc, UserError) else _raised(target, exc))


def build_custom(cfg: CustomModelConfig, num_features: int, num_outputs: int,
                 image_shape: tuple[int, ...] | None, task: str,
                 input_dtype: torch.dtype = torch.float32) -> nn.Module:
    """The user's module, checked: float32 parameters, logits ``[B, num_outputs]`` from a
    batch of ``input_dtype`` (int64 for integer features kept), built within
    ``cfg.build_timeout_s``. Seeding is the caller's (``build_model``)."""
    return _bounded(cfg._target_, cfg.build_timeout_s, lambda: _checked(
        cfg, num_features, num_outputs, image_shape, task, input_dtype))


def _checked(cfg: CustomModelConfig, num_features: int, num_outputs: int,
             image_shape: tuple[int, ...] | None, task: str, input_dtype: torch.dtype) -> nn.Module:
    target = cfg._target_
    factory = locate(KEY, target)
    given = _given(cfg, factory, data_arguments(num_features, num_outputs, image_shape, task))
    try:  # the user's kwargs go through Hydra (nested _target_s are built too); ours stay tuples
        build = instantiate({"_target_": target, "_partial_": True, "_convert_": "all",
                             **cfg.kwargs})
    except InstantiationException as exc:
        raise _raised(target, exc.__cause__ if exc.__cause__ is not None else exc) from None
    try:
        module = build(**given)
    except Exception as exc:
        raise _raised(target, exc) from None
    if not isinstance(module, nn.Module):
        raise UserError(f"model._target_={target}: it returns a {type(module).__name__}, not an "
                        "nn.Module")
    module.float()
    _check_parameters(target, module)
    return _probe(target, module, num_features, num_outputs, task, input_dtype)
