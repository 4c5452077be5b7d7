package pgtable

// Identifier checks the identifier rule stated on Options.Table, and Quote
// quotes a name that passed it, for the fuzz test.
var (
	Identifier = identifier
	Quote      = quote
)
