"""torchalloc.track(model, optimizer): tag a training step's phases automatically.

Semantics (all phases are process-wide, see phases.py):

- "forward": from the top-level `model`'s forward pre-hook to its forward
  hook (registered with always_call, so an exception still ends it). Only
  the top-level module is hooked: submodules run inside its forward.
- "backward": the whole of every autograd pass, i.e. every call of
  torch.autograd.backward (which Tensor.backward, hence loss.backward() and
  GradScaler's scaled loss, goes through) and torch.autograd.grad. It
  begins before the engine runs the first node and ends when the call
  returns, so the loss head's gradients (e.g. the logits' gradient, often
  the largest backward allocation) and everything the engine's device
  threads allocate are included. Loss computation between forward and
  backward stays in the enclosing phase.
- "optimizer": optimizer.step(), through register_step_pre_hook and
  register_step_post_hook (an LR scheduler's own step wrapper is untouched).
- "zero_grad": optimizer.zero_grad() and model.zero_grad().

A name prefix (`prefix="gen."` gives "gen.forward" ...) tells several
tracked models apart; autograd passes are process-wide, so while several
handles are active they are all tagged with the first handle's backward
name. If optimizer.step() raises, its phase stays open (torch runs no post
hook then). The returned handle's remove() undoes everything.

Why autograd's entry points are wrapped rather than hooked on tensors: a
hook on the forward output fires only once the engine reaches the model's
output, after the loss head's gradients were allocated, and it ends on an
engine thread. Wrapping the two Python entry points begins and ends the
phase on the calling thread, in LIFO order with the user's own phases.
The wrapper is installed once for all handles and removed with the last one.
"""
from __future__ import annotations

import functools
import threading
import types
from typing import Any, Callable

from .phases import phase

_autograd_lock = threading.Lock()
_autograd_users: dict[str, int] = {}  # backward phase name -> handles using it
_autograd_originals: dict[str, Callable[..., Any]] = {}


def _wrap_autograd_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        names = list(_autograd_users)
        if not names:
            return original(*args, **kwargs)
        with phase(names[0]):
            return original(*args, **kwargs)

    wrapper.__torchalloc_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _autograd_acquire(name: str) -> None:
    import torch.autograd

    with _autograd_lock:
        if not _autograd_originals:
            for entry in ("backward", "grad"):
                original = getattr(torch.autograd, entry)
                _autograd_originals[entry] = original
                setattr(torch.autograd, entry, _wrap_autograd_entry(original))
        _autograd_users[name] = _autograd_users.get(name, 0) + 1


def _autograd_release(name: str) -> None:
    import torch.autograd

    with _autograd_lock:
        _autograd_users[name] -= 1
        if _autograd_users[name] == 0:
            del _autograd_users[name]
        if not _autograd_users:
            for entry, original in _autograd_originals.items():
                setattr(torch.autograd, entry, original)
            _autograd_originals.clear()


class TrackHandle:
    """What track() installed; remove() takes all of it out again."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names = {k: prefix + k for k in ("forward", "backward", "optimizer", "zero_grad")}
        self._undo: list[Callable[[], None]] = []

    def _on_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def remove(self) -> None:
        """Remove every hook and wrapper (idempotent)."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> "TrackHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _hook_forward(handle: TrackHandle, model: Any, eval_phase: str | None) -> None:
    forward = phase(handle.names["forward"])
    evaluation = forward if eval_phase is None else phase(handle.prefix + eval_phase)
    entered: list[phase] = []  # the phase each running forward entered (forwards may nest: recursion)

    def pre_hook(module: Any, args: Any) -> None:
        chosen = forward if module.training else evaluation
        chosen.__enter__()
        entered.append(chosen)

    def post_hook(module: Any, args: Any, output: Any) -> None:
        if entered:
            entered.pop().__exit__(None, None, None)

    pre = model.register_forward_pre_hook(pre_hook)
    try:
        post = model.register_forward_hook(post_hook, always_call=True)
    except TypeError:  # torch before always_call: an exception in forward leaves it open
        post = model.register_forward_hook(post_hook)
    handle._on_undo(pre.remove)
    handle._on_undo(post.remove)


def _hook_optimizer(handle: TrackHandle, optimizer: Any) -> None:
    step = phase(handle.names["optimizer"])

    # Both hooks must return None: a pre-hook's return value replaces step()'s arguments.
    def pre_hook(opt: Any, args: Any, kwargs: Any) -> None:
        step.__enter__()

    def post_hook(opt: Any, args: Any, kwargs: Any) -> None:
        step.__exit__(None, None, None)

    pre = optimizer.register_step_pre_hook(pre_hook)
    post = optimizer.register_step_post_hook(post_hook)
    handle._on_undo(pre.remove)
    handle._on_undo(post.remove)


def _wrap_zero_grad(handle: TrackHandle, obj: Any) -> None:
    """Wrap obj.zero_grad on the instance, as a bound method (so nothing that
    inspects it, like LR schedulers do with step, sees a plain function)."""
    zero = phase(handle.names["zero_grad"])
    had_own = "zero_grad" in vars(obj)
    original = obj.zero_grad

    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        with zero:
            return original(*args, **kwargs)

    obj.zero_grad = types.MethodType(functools.wraps(original)(zero_grad), obj)

    def undo() -> None:
        if had_own:
            obj.zero_grad = original
        else:
            vars(obj).pop("zero_grad", None)

    handle._on_undo(undo)


def track(
    model: Any,
    optimizer: Any | None = None,
    *,
    prefix: str = "",
    zero_grad: bool = True,
    eval_phase: str | None = None,
) -> TrackHandle:
    """Tag forward, backward, optimizer step and zero_grad of `model` as phases.

    See this module's docstring for exactly what each phase covers.
    zero_grad=False leaves model.zero_grad alone (a trainer that marks that
    part of the step itself). eval_phase names the phase of a forward run
    while the model is in eval mode (model.training False; default: "forward"
    as in training), so evaluation inside a training run is told apart.
    Returns a handle; call .remove() (or use it as a context manager) to stop.
    """
    handle = TrackHandle(prefix)
    try:
        _hook_forward(handle, model, eval_phase)
        _autograd_acquire(handle.names["backward"])
        handle._on_undo(lambda: _autograd_release(handle.names["backward"]))
        if zero_grad:
            _wrap_zero_grad(handle, model)
        if optimizer is not None:
            _hook_optimizer(handle, optimizer)
            _wrap_zero_grad(handle, optimizer)
    except BaseException:
        handle.remove()
        raise
    return handle
