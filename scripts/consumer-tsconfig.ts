/**
 * The compiler settings of a user's strict TypeScript project, for the checks that compile a
 * consumer of the published declarations (test/client/published.test.ts, scripts/pack-check.ts).
 */
export function strictConsumerTsconfig(file: string, options: { emit: boolean }): string {
  return JSON.stringify({
    compilerOptions: {
      target: 'ES2022',
      lib: ['ES2023', 'ESNext.Disposable'],
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      strict: true,
      noEmit: !options.emit,
      types: ['node'],
    },
    files: [file],
  });
}
