// Package lru is the intrusive doubly-linked list of the stores' LRU
// caches (the memory store's keys, the DynamoDB store's item cache): a
// value embeds Links, so that adding and moving it costs no allocation
// (container/list allocates an Element per value, once per key, on the
// stores' hot path).
package lru

// Links are the list pointers a value of type T embeds.
type Links[T any] struct{ prev, next *T }

func (l *Links[T]) links() *Links[T] { return l }

// Elem is a pointer to a value that embeds Links.
type Elem[T any] interface {
	*T
	links() *Links[T]
}

// List is a list of *T, most recent at the front. Call Init before use;
// a List must not be copied after.
type List[T any, P Elem[T]] struct {
	head T // the sentinel
}

func (l *List[T, P]) sentinel() *Links[T] { return P(&l.head).links() }

// Init makes l empty.
func (l *List[T, P]) Init() {
	s := l.sentinel()
	s.prev, s.next = &l.head, &l.head
}

// PushFront adds e, not in a list, at the front.
func (l *List[T, P]) PushFront(e *T) {
	s, n := l.sentinel(), P(e).links()
	n.prev, n.next = &l.head, s.next
	P(s.next).links().prev = e
	s.next = e
}

// Remove takes e out of l.
func (l *List[T, P]) Remove(e *T) {
	n := P(e).links()
	P(n.prev).links().next, P(n.next).links().prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

// MoveToFront moves e, in l, to the front.
func (l *List[T, P]) MoveToFront(e *T) {
	l.Remove(e)
	l.PushFront(e)
}

// Back returns the least recent value, or nil when l is empty.
func (l *List[T, P]) Back() *T { return l.outside(l.sentinel().prev) }

// Prev returns the value before e toward the back's opposite (the next
// more recent one), or nil at the front.
func (l *List[T, P]) Prev(e *T) *T { return l.outside(P(e).links().prev) }

func (l *List[T, P]) outside(e *T) *T {
	if e == &l.head {
		return nil
	}
	return e
}
