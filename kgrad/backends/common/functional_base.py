"""A `keras.Model` subclass that is also built functionally, as ``keras.Model(inputs, outputs)`` is.

``keras.Model(inputs, outputs)`` returns a ``Functional``; Keras does so by
rewriting the ``__bases__`` of a subclass called with functional arguments to
include ``Functional``. kgrad's ``ProbingModel`` (on each backend) does the
same with a ``Functional`` subclass of its own, so that Keras' rewrite never
reaches ``ProbingModel`` itself (it would change every class built on it).
"""


def use_functional_base(cls, base, functional_base):
    """Replaces ``base`` by ``functional_base`` among the bases of ``cls`` (recursively); returns ``cls``.

    Example:

    >>> class Base: pass
    >>> class FunctionalBase(Base): pass
    >>> class Mine(Base): pass
    >>> use_functional_base(Mine, Base, FunctionalBase).__bases__ == (FunctionalBase,)
    True
    """
    if cls is base:
        return functional_base
    if issubclass(cls, base) and not issubclass(cls, functional_base):
        cls.__bases__ = tuple(use_functional_base(parent, base, functional_base) for parent in cls.__bases__)
    return cls
