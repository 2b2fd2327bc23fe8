"""Fakes for hardware and time boundaries, shipped in the package so tests and dry runs use them.

- ``fake_pynvml.FakePynvml``: a scriptable stand-in for the ``pynvml`` module.
- ``analyzer.FakeAnalyzer``: the request-path seam (``Analyzer``) over a real engine, for front ends.
"""
