"""Pure-``jnp`` reference operators; they import no kernel. The Pallas kernels in ``pallas_kernels/``
share their signatures, and ``jaxwm.kernels`` chooses between the two by ``impl=``."""
