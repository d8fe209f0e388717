"""Database Mail compatibility in Python: the layout of ``@query`` results
(:mod:`.layout`) and the query runner (:mod:`.runner`)."""
