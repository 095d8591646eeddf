"""kgrad's benchmark harness: what probing costs against plain ``model.fit``.

Run ``python -m benchmarks.run`` (see ``benchmarks/README.md``). Nothing here
is part of the ``kgrad`` package; it is excluded from the unit tests, except a
smoke test of the quick mode.
"""
