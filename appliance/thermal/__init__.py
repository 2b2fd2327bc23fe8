"""The thermal side of the appliance: keep the GPU sensor below its wall by pacing batch dispatch.

One module per job (``docs/thermal.md``):

- :mod:`~appliance.thermal.governor`: the pure governor (readings in, duty out) and its fail-safe.
- :mod:`~appliance.thermal.sensorcheck`: sample validation and the frozen-sensor detector (pure).
- :mod:`~appliance.thermal.source`: the :class:`Thermometer` interface, ``NoThermometer``, the factory.
- :mod:`~appliance.thermal.nvml`: the NVML thermometer; :mod:`~appliance.thermal.fake_pynvml`: its fake.
- :mod:`~appliance.thermal.plant` and :mod:`~appliance.thermal.simulated`: the simulated GPU and thermometer.
- :mod:`~appliance.thermal.control`: the control loop, its status, and :func:`health_action`.
- :mod:`~appliance.thermal.commissioning`: measure on the real box what the simulation assumed.
- :mod:`~appliance.thermal.sim`, :mod:`~appliance.thermal.matrix`, :mod:`~appliance.thermal.simcli`: the
  closed-loop simulation, the fault matrix and the ``appliance thermal-sim`` command.

Importing this package loads nothing heavy; the NVML and simulation modules are imported on use.
"""
