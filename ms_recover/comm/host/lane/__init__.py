"""The host backend's lane: one authenticated TCP connection per pair of ranks (:mod:`.lanes`),
the exchange of a large buffer (:mod:`.exchange`), of a small one (:mod:`.small`), what goes on
the wire (:mod:`.frame`) and the memory kept across calls (:mod:`.buffers`)."""
