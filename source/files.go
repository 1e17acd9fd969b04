package source

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sharelimit/sharelimit/descriptors"
)

// Load compiles files and directories (every *.yaml and *.yml directly inside
// a directory, dotfiles ignored) into one Set. Every error in every file is
// reported, each as a *descriptors.Error with its file:line:col.
func Load(paths ...string) (*descriptors.Set, error) {
	return LoadWith(Options{}, paths...)
}

// Options say how directories are read and files compiled.
type Options struct {
	// Compile joins the files (merged domains).
	Compile descriptors.CompileOptions
	// AllFiles reads every file under a directory, in its subdirectories
	// too, whatever the name ends in, as upstream's runtime loader does;
	// dotfiles and dot directories are still skipped. Without it, only the
	// *.yaml and *.yml files directly inside are read.
	AllFiles bool
}

// LoadWith is Load with options.
func LoadWith(opts Options, paths ...string) (*descriptors.Set, error) {
	var names []string
	var errs []error
	for _, path := range paths {
		fi, err := os.Stat(path)
		if err != nil {
			errs = append(errs, fileError(path, "stat", err))
			continue
		}
		if !fi.IsDir() {
			names = append(names, path)
			continue
		}
		found, err := ListFiles(path, opts.AllFiles)
		if err != nil {
			errs = append(errs, fileError(path, "read dir", err))
			continue
		}
		names = append(names, found...)
	}
	files := make([]descriptors.File, 0, len(names))
	readErrs := make([]error, len(names))
	for i, name := range names {
		f, err := readFile(name)
		readErrs[i] = err
		files = append(files, f)
	}
	if len(errs) == 0 && !slices.ContainsFunc(readErrs, func(err error) bool { return err != nil }) {
		return descriptors.CompileWith(opts.Compile, files...)
	}
	// Something could not be read: report it with every file's own errors, in
	// file order, as if each stood alone. Whether two files define the same
	// domain waits until every file can be read.
	for i, f := range files {
		if readErrs[i] != nil {
			errs = append(errs, readErrs[i])
		} else if _, err := descriptors.Compile(f); err != nil {
			errs = append(errs, err)
		}
	}
	return nil, errors.Join(errs...)
}

// readFile reads one config file, and no more than one byte past
// descriptors.MaxFileBytes, so Compile can refuse an oversized file without
// this holding all of it.
func readFile(name string) (descriptors.File, error) {
	fh, err := os.Open(name)
	if err != nil {
		return descriptors.File{}, fileError(name, "open", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, descriptors.MaxFileBytes+1))
	if err != nil {
		return descriptors.File{}, &descriptors.Error{Pos: descriptors.Pos{File: name, Line: 1, Col: 1}, Msg: fmt.Sprintf("read: %v", err)}
	}
	return descriptors.File{Name: name, Data: data}, nil
}

func fileError(name, op string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &descriptors.Error{Pos: descriptors.Pos{File: name}, Msg: fmt.Sprintf("%s: %v", op, err)}
}

// ListDir returns the config files directly in dir, sorted: *.yaml and *.yml,
// without dotfiles (which also skips Kubernetes' ..data bookkeeping entries).
func ListDir(dir string) ([]string, error) { return ListFiles(dir, false) }

// ListFiles returns the config files in dir, sorted: with all, every regular
// file in dir and below whatever its name (see Options.AllFiles); without,
// ListDir's. Names starting with a dot are skipped either way, directories
// included: Kubernetes' ..data and ..2026_... entries hold the same files
// again.
func ListFiles(dir string, all bool) ([]string, error) {
	if !all {
		return listTop(dir)
	}
	// WalkDir does not follow a root that is a symlink (a runtime swap
	// layout, a link to a volume): walk where it points, and name the files
	// under the path as given.
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	err = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		if strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() {
			return nil
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() { // follows symlinks to files
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			out = append(out, filepath.Join(dir, rel))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

func listTop(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		ext := strings.ToLower(filepath.Ext(name))
		if ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(dir, name)
		fi, err := os.Stat(full) // follows the symlinks ConfigMaps are made of
		if err != nil || !fi.Mode().IsRegular() {
			continue // a directory, or a pipe or device a read would block on
		}
		out = append(out, full)
	}
	slices.Sort(out)
	return out, nil
}
