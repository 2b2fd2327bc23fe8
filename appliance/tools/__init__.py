"""Operator and developer tools built on the runtime.

Benchmarks and their Triton peer, the synthetic CT
generator, ``appliance doctor``, chaos and soak runs. Nothing on the request path imports from here.
"""
