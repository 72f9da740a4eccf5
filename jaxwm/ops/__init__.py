"""Pure-``jnp`` reference operators. Kernels in ``pallas_kernels/`` share their signatures."""
