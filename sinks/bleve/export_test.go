package bleve

// Hold takes a reference to the live index as a search in flight does, and
// returns the index directory's name and the release.
func Hold(s *Searcher) (name string, release func(), err error) {
	ix, err := s.acquire()
	if err != nil {
		return "", nil, err
	}
	return ix.name, func() { s.r.put(ix) }, nil
}

// TargetName is the directory name of a resync target OpenResync returned.
func TargetName(t any) string { return t.(*resync).ix.name }
