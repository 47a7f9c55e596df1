"""How a run begins: fresh, resumed, continued or from given weights; the student loaded or sharded at its start."""
