"""The producer's half: messages built and published the way semel's consumer reads them."""
