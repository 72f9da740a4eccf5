"""Operator interfaces: argument checks and input preparation shared by a ``jaxwm/ops`` reference and its kernels
(``pallas_kernels``, ``xla_kernels``), so kernels never import the reference and both refuse the same inputs."""
