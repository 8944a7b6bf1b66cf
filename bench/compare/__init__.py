"""`make bench`: every contender on the same model, machine and load generator (see __main__)."""
