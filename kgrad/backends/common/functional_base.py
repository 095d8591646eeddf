"""A `keras.Model` subclass that is also built functionally, as ``keras.Model(inputs, outputs)`` is.

``keras.Model(inputs, outputs)`` returns a ``Functional``; Keras does so by
rewriting the ``__bases__`` of a subclass called with functional arguments to
include ``Functional``. kgrad's ``ProbingModel`` (on each backend) does the
same with a ``Functional`` subclass of its own, so that Keras' rewrite never
reaches ``ProbingModel`` itself (it would change every class built on it).
"""

from kgrad.backends.common.keras_internals import Functional, functional_init_arguments


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


class BuiltFunctionally:
    """Mixin of a `keras.Model` subclass that ``Base(inputs, outputs)`` builds as its ``Functional`` twin.

    The class sets ``_functional_pair = (Base, FunctionalBase)`` once both are
    defined. ``Base(inputs, outputs)`` returns a ``FunctionalBase``, as
    ``keras.Model(inputs, outputs)`` returns a ``Functional``; a subclass of
    ``Base`` built functionally gets ``FunctionalBase`` among its bases, so that
    Keras' own rewrite of bases never reaches ``Base``.
    """

    _functional_pair = None

    def __new__(cls, *args, **kwargs):
        base, functional = cls._functional_pair
        if cls is base and functional_init_arguments(args, kwargs):
            return functional.__new__(functional, *args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        base, functional = type(self)._functional_pair
        if functional_init_arguments(args, kwargs) and not isinstance(self, Functional):
            use_functional_base(type(self), base, functional)
        super().__init__(*args, **kwargs)
