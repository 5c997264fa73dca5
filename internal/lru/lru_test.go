package lru

import (
	"slices"
	"testing"
)

type item struct {
	Links[item]
	v int
}

// order returns the values from the back (least recent) to the front.
func order(l *List[item, *item]) []int {
	var out []int
	for e := l.Back(); e != nil; e = l.Prev(e) {
		out = append(out, e.v)
	}
	return out
}

func TestList(t *testing.T) {
	var l List[item, *item]
	l.Init()
	if l.Back() != nil {
		t.Fatal("an empty list has a back")
	}
	a, b, c := &item{v: 1}, &item{v: 2}, &item{v: 3}
	l.PushFront(a)
	l.PushFront(b)
	l.PushFront(c)
	if got := order(&l); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("after pushes: %v", got)
	}
	l.MoveToFront(a)
	if got := order(&l); !slices.Equal(got, []int{2, 3, 1}) {
		t.Fatalf("after moving 1 to the front: %v", got)
	}
	l.Remove(c)
	if got := order(&l); !slices.Equal(got, []int{2, 1}) {
		t.Fatalf("after removing 3: %v", got)
	}
	l.Remove(b)
	l.Remove(a)
	if l.Back() != nil {
		t.Fatalf("emptied list: %v", order(&l))
	}
}
