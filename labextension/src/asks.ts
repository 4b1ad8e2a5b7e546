// What the view asks the kernel for as the user wants it: the code and the metrics of the step it shows where they
// did not come with its pictures (`inspected` false: a graph past widget.py's INSPECT_AT_ONCE nodes, whose code and
// metrics take seconds to work out), asked when an overlay is chosen or a node's code opened, not after every step:
// the kernel stays free for the user's next request. Pure code, tested under node.
import { SessionMessage, SessionState } from './protocol';

// The state as the view reads it: one trait by name, typed as protocol.ts declares it.
export type StateReader = <K extends keyof SessionState>(key: K) => SessionState[K];

export class Asks {
  // the pictures asked about last: asked once each (where the kernel could not work them out, it is not asked again)
  private askedAbout: SessionState['graphs'] | null = null;

  constructor(private readonly send: (message: SessionMessage) => void) {}

  // Ask for what the shown step lacks, once per pictures the kernel sends; called as the user wants it.
  want(get: StateReader): void {
    const graphs = get('graphs');
    if (get('inspected') || !(graphs.forward || graphs.backward) || graphs === this.askedAbout) {
      return;
    }
    this.askedAbout = graphs;
    this.send({ event: 'inspect', index: get('shown') });
  }
}
