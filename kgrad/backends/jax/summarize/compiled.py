"""kgrad's own computations as compiled calls of their own, also in a step that runs op by op.

In a jitted step a ``jax.jit`` inside is inlined: XLA compiles one program, as
before. In a step run op by op (``jit_compile=False``, ``run_eagerly=True``),
JAX compiles and dispatches every operation on its own, each new shape
compiles again, and a ``lax.cond`` built in the call compiles at every call:
a two-epoch un-jitted probed fit of a two-layer MLP compiled 439 programs in
18 CPU-s, and a second such fit 144 more. Compiled on its own, a statistics
function (or a check, or the spike rule) is one program per shape and one
dispatch a call: 21 programs in 2.9 CPU-s, then none (`benchmarks/op_by_op.py`).
The training arithmetic stays op by op, as Keras runs it: only what kgrad reads
and decides is compiled.

Under a ``keras.distribution`` over several devices the function is called as
it is, traced into the step: there a ``jax.jit`` inside the step's was not
neutral. The compiled probed step of `tests/jax/test_model_parallel_hlo_jax.py`
held 236 collective-permutes instead of 8 (XLA's SPMD partitioner resharding
small values at each call's boundary) and 6.7 KB more temporaries per device.
So a compiled call is always traced for one device, which the functions
read at trace time (`one_pass.on_several_devices`) and need no key for.

Example:

>>> import jax.numpy as jnp
>>> @compiled_on_its_own(static_argnames=("power",))
... def total(x, power):
...     return jnp.sum(x**power)
>>> float(total(jnp.array([1.0, 2.0]), power=2))
5.0
"""

import functools
import inspect

import jax

from kgrad.backends.jax.summarize.one_pass import on_several_devices


def compiled_on_its_own(function=None, *, static_argnames=()):
    """``function`` under ``jax.jit``, on one device (see the module).

    ``static_argnames``: its arguments that are not arrays (bucket counts,
    columns, a rule's name), passed by position or by name: hashable, each
    value a compiled call of its own.
    """
    if function is None:
        return functools.partial(compiled_on_its_own, static_argnames=static_argnames)
    signature = inspect.signature(function)

    @functools.partial(jax.jit, static_argnums=1)
    def jitted(arrays, static):
        return function(**arrays, **dict(static))

    @functools.wraps(function)
    def call(*args, **kwargs):
        if on_several_devices():
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arrays = {name: value for name, value in bound.arguments.items() if name not in static_argnames}
        return jitted(arrays, tuple((name, bound.arguments[name]) for name in static_argnames))

    return call
