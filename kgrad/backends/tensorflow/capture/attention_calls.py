"""The attention calls of TensorFlow's probed step, for ``instruments=["attention"]``.

Which layers are scored, how their q, k, scale, soft cap and masks are read, and
the reasons for the others are written once for every backend
(`kgrad.backends.common.attention_calls`). What is TensorFlow's own: only calls
traced into the graph that was current when the probe started recording are
kept, as `kgrad.backends.tensorflow.capture.recorder` keeps only that graph's
tensors. A call traced into a graph of its own (the body of a ``tf.while_loop``
or ``tf.map_fn``) gives tensors the probed step cannot use.
"""

import contextlib

import tensorflow as tf

from kgrad.backends.common import attention_calls


def _current_graph():
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def intercept(model):
    """Records the attention calls of ``model`` made in the current graph while the block runs.

    Yields a `kgrad.backends.common.attention_calls.AttentionCapture`.

    Example:

    >>> import keras, tensorflow as tf
    >>> x = keras.Input((3, 4))
    >>> model = keras.Model(x, keras.layers.MultiHeadAttention(2, 2, name="mha")(x, x))
    >>> with intercept(model) as capture:
    ...     _ = model(tf.ones((1, 3, 4)))
    >>> [(call.name, call.query.shape) for call in capture.calls]
    [('mha', TensorShape([1, 3, 2, 2]))]
    """
    graph = _current_graph()
    with attention_calls.intercept(model, recording=lambda: _current_graph() is graph) as capture:
        yield capture
