"""``shmbuf demo`` (:mod:`~shmbuf.demo.run`) and the small vectorised environment it steps
(:mod:`~shmbuf.demo.envs`)."""
