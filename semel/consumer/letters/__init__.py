"""The dead letters: their stream (:mod:`.log`) and what an operator does with them."""
