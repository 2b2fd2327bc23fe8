"""Fakes for hardware and time boundaries, shipped in the package so tests and dry runs use them.

- ``fake_pynvml.FakePynvml``: an alias of :class:`appliance.thermal.fake_pynvml.FakePynvml`, the faithful
  stand-in for the ``pynvml`` module (kept here for existing imports).
- ``analyzer.FakeAnalyzer``: the request-path seam (``Analyzer``) over a real engine, for front ends.
"""
